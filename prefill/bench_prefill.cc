#include "prefill/bench_prefill.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/model_loader.h"
#include "core/model/sharded_model.h"
#include "core/tensor/tensor.h"
#include "nlohmann/json.hpp"
#include "prefill/prefill_engine.h"

namespace estuary {
namespace {

// Dense parameters a token multiplies through in one layer: q, k, v, o, gate, up, down.
int64_t ProjectionParamsPerLayer(const LlamaConfig& c) {
  const int64_t q = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
  return int64_t{c.dim} * q * 2 + int64_t{c.dim} * kv * 2 + int64_t{3} * c.dim * c.hidden_dim;
}

double DenseFlops(const LlamaConfig& c, int tokens) {
  return 2.0 * tokens * static_cast<double>(ProjectionParamsPerLayer(c)) * c.n_layers +
         2.0 * static_cast<double>(c.vocab_size) * c.dim;  // LM head, last token only
}

// One timed prefill of `prompt` through a fresh engine; returns the best wall time.
absl::StatusOr<double> TimePrefill(ShardedModel& model, const BenchPrefillOptions& options,
                                   const std::vector<int32_t>& prompt) {
  const LlamaConfig& c = model.config();
  PrefillEngineOptions engine_options;
  engine_options.max_num_batched_tokens = options.max_num_batched_tokens;
  const KvLayout layout = KvLayout::FromConfig(c, engine_options.block_size, model.tp_size());
  const int64_t pages = (static_cast<int64_t>(prompt.size()) + engine_options.block_size - 1) /
                            engine_options.block_size +
                        2;
  engine_options.kv_cache_bytes = pages * layout.page_bytes() * model.tp_size();
  absl::Status failure;
  PrefillSink sink;
  sink.on_done = [&failure](PrefillDone& done) {
    if (!done.status.ok()) failure = done.status;
  };
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine,
                           PrefillEngine::Create(model, engine_options, sink));
  // Warm-up: a few tokens touch every weight once (page faults of the mapped file, TP copies).
  PrefillRequest warm;
  warm.request_id = "warm-up";
  warm.prompt_ids.assign(prompt.begin(), prompt.begin() + std::min<size_t>(8, prompt.size()));
  ESTUARY_RETURN_IF_ERROR(engine->Submit(std::move(warm)));
  ESTUARY_RETURN_IF_ERROR(engine->RunUntilIdle());
  ESTUARY_RETURN_IF_ERROR(failure);

  double best = std::numeric_limits<double>::infinity();
  for (int it = 0; it < options.prefill_iterations; ++it) {
    PrefillRequest request;
    request.request_id = absl::StrFormat("bench-%d", it);
    request.prompt_ids = prompt;
    const absl::Time start = absl::Now();
    ESTUARY_RETURN_IF_ERROR(engine->Submit(std::move(request)));
    ESTUARY_RETURN_IF_ERROR(engine->RunUntilIdle());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    ESTUARY_RETURN_IF_ERROR(failure);
    best = std::min(best, seconds);
  }
  return best;
}

absl::StatusOr<Tensor> RandomWeight(int64_t out, int64_t in, std::mt19937& rng) {
  ESTUARY_ASSIGN_OR_RETURN(Tensor w, Tensor::Zeros(DType::kF32, {out, in}));
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  float* data = w.mutable_data<float>();
  for (int64_t i = 0; i < out * in; ++i) data[i] = u(rng);
  return w;
}

// Best-of-`iterations` seconds of `fn` after one untimed call.
template <typename Fn>
absl::StatusOr<double> BestSeconds(int iterations, Fn&& fn) {
  ESTUARY_RETURN_IF_ERROR(fn());
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iterations; ++i) {
    const absl::Time start = absl::Now();
    ESTUARY_RETURN_IF_ERROR(fn());
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
  }
  return best;
}

absl::StatusOr<BenchPrefillRow> MeasureMatMul(const std::string& name, int64_t out, int64_t in,
                                              int64_t n, int threads, int iterations) {
  std::mt19937 rng(11);
  ESTUARY_ASSIGN_OR_RETURN(Tensor w, RandomWeight(out, in, rng));
  ESTUARY_ASSIGN_OR_RETURN(Tensor w_bf16, ConvertDType(w, DType::kBF16));
  std::vector<float> x(static_cast<size_t>(n * in)), y(static_cast<size_t>(n * out));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(out) * in;
  WorkerPool pool(threads);
  const kernels::cpu::MatMulOptions invariant{kernels::cpu::MatMulPath::kBatchInvariant, &pool};

  ESTUARY_ASSIGN_OR_RETURN(const double bi_f32, BestSeconds(iterations, [&] {
                             return kernels::cpu::MatMul(w, x.data(), n, y.data(), invariant);
                           }));
  ESTUARY_ASSIGN_OR_RETURN(const double bi_bf16, BestSeconds(iterations, [&] {
                             return kernels::cpu::MatMul(w_bf16, x.data(), n, y.data(), invariant);
                           }));
  kernels::cpu::SetCpuThreads(threads);
  ESTUARY_ASSIGN_OR_RETURN(const double sgemm, BestSeconds(iterations, [&] {
                             // y = x W^T, as the library's prefill sgemm path.
                             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                                         static_cast<blasint>(n), static_cast<blasint>(out),
                                         static_cast<blasint>(in), 1.0f, x.data(),
                                         static_cast<blasint>(in), w.data<float>(),
                                         static_cast<blasint>(in), 0.0f, y.data(),
                                         static_cast<blasint>(out));
                             return absl::OkStatus();
                           }));
  BenchPrefillRow row;
  row.kind = "matmul";
  row.projection = name;
  row.out = out;
  row.in = in;
  row.n_tokens = n;
  row.threads = threads;
  row.batch_invariant_gflops = flops / bi_f32 / 1e9;
  row.batch_invariant_bf16_gflops = flops / bi_bf16 / 1e9;
  row.sgemm_gflops = flops / sgemm / 1e9;
  row.ratio = row.batch_invariant_gflops / row.sgemm_gflops;
  return row;
}

}  // namespace

absl::StatusOr<BenchPrefillReport> MeasurePrefill(const BenchPrefillOptions& options) {
  if (options.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--prompt-tokens = %d must be >= 1", options.prompt_tokens));
  }
  if (options.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-num-batched-tokens must be >= 1");
  }
  if (options.prefill_iterations < 1 || options.matmul_iterations < 1) {
    return absl::InvalidArgumentError("iteration counts must be >= 1");
  }
  if (options.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  LoadOptions load;
  if (!options.dtype.empty()) {
    load.dtype = ParseDType(options.dtype);
    if (!load.dtype || (*load.dtype != DType::kF32 && *load.dtype != DType::kBF16)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--dtype = '%s' must be f32 or bf16", options.dtype));
    }
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  BenchPrefillReport report;
  report.model = options.model_path;
  report.gemv_target = kernels::cpu::GemvTargetName();
  LlamaConfig config;
  for (int tp : options.tp_sizes) {
    ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options.model_path, load));
    config = loaded.model->config();
    report.weight_dtype = DTypeName(loaded.model->weights().layers[0].wq.dtype());
    if (options.prompt_tokens >= config.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--prompt-tokens = %d must be below the context (%d)", options.prompt_tokens,
          config.max_seq_len));
    }
    ShardedModelOptions sharded_options;
    sharded_options.tp_size = tp;
    sharded_options.threads_per_rank = std::max(1, threads / tp);
    ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<ShardedModel> model,
                             ShardedModel::Create(std::move(loaded.model), sharded_options));
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
    std::vector<int32_t> prompt(static_cast<size_t>(options.prompt_tokens));
    for (int32_t& id : prompt) id = token(rng);
    ESTUARY_LOG(INFO) << "bench-prefill: tp " << tp << ", " << options.prompt_tokens
                      << " tokens in chunks of " << options.max_num_batched_tokens << ", "
                      << sharded_options.threads_per_rank << " threads per rank";
    ESTUARY_ASSIGN_OR_RETURN(const double seconds, TimePrefill(*model, options, prompt));
    BenchPrefillRow row;
    row.kind = "prefill";
    row.tp = tp;
    row.threads = sharded_options.threads_per_rank * tp;
    row.prompt_tokens = options.prompt_tokens;
    row.chunk = std::min(options.max_num_batched_tokens, options.prompt_tokens);
    row.seconds = seconds;
    row.tokens_per_second = options.prompt_tokens / seconds;
    row.dense_gflops = DenseFlops(config, options.prompt_tokens) / seconds / 1e9;
    report.rows.push_back(row);
  }

  if (!options.skip_matmul && config.n_layers > 0) {
    const int64_t dim = config.dim, q = int64_t{config.n_heads} * config.head_dim;
    const int64_t kv = int64_t{config.n_kv_heads} * config.head_dim, ffn = config.hidden_dim;
    const int64_t n = std::min(options.max_num_batched_tokens, options.prompt_tokens);
    struct Shape {
      const char* name;
      int64_t out, in;
    };
    for (const Shape& s : {Shape{"q", q, dim}, Shape{"k/v", kv, dim}, Shape{"o", dim, q},
                           Shape{"gate/up", ffn, dim}, Shape{"down", dim, ffn}}) {
      ESTUARY_LOG(INFO) << "bench-prefill: matmul " << s.name << " " << s.out << "x" << s.in
                        << " at " << n << " tokens";
      ESTUARY_ASSIGN_OR_RETURN(
          BenchPrefillRow row,
          MeasureMatMul(s.name, s.out, s.in, n, threads, options.matmul_iterations));
      report.rows.push_back(row);
    }
  }
  return report;
}

std::string BenchPrefillJson(const BenchPrefillReport& report) {
  nlohmann::ordered_json out;
  out["model"] = report.model;
  out["weight_dtype"] = report.weight_dtype;
  out["gemv_target"] = report.gemv_target;
  out["rows"] = nlohmann::ordered_json::array();
  for (const BenchPrefillRow& r : report.rows) {
    if (r.kind == "prefill") {
      out["rows"].push_back({{"kind", r.kind},
                             {"tp", r.tp},
                             {"threads", r.threads},
                             {"prompt_tokens", r.prompt_tokens},
                             {"chunk", r.chunk},
                             {"seconds", r.seconds},
                             {"tokens_per_second", r.tokens_per_second},
                             {"dense_gflops", r.dense_gflops}});
    } else {
      out["rows"].push_back({{"kind", r.kind},
                             {"projection", r.projection},
                             {"out", r.out},
                             {"in", r.in},
                             {"n_tokens", r.n_tokens},
                             {"threads", r.threads},
                             {"batch_invariant_gflops", r.batch_invariant_gflops},
                             {"batch_invariant_bf16_gflops", r.batch_invariant_bf16_gflops},
                             {"sgemm_gflops", r.sgemm_gflops},
                             {"ratio", r.ratio}});
    }
  }
  return out.dump();
}

std::string BenchPrefillTable(const BenchPrefillReport& report) {
  std::string table = absl::StrFormat("model %s (%s weights), batched GEMV target %s\n",
                                      report.model, report.weight_dtype, report.gemv_target);
  absl::StrAppendFormat(&table, "%-4s %8s %7s %6s %10s %12s %14s\n", "tp", "threads", "prompt",
                        "chunk", "seconds", "tokens/s", "dense GFLOP/s");
  for (const BenchPrefillRow& r : report.rows) {
    if (r.kind != "prefill") continue;
    absl::StrAppendFormat(&table, "%-4d %8d %7d %6d %10.2f %12.1f %14.1f\n", r.tp, r.threads,
                          r.prompt_tokens, r.chunk, r.seconds, r.tokens_per_second,
                          r.dense_gflops);
  }
  bool header = false;
  for (const BenchPrefillRow& r : report.rows) {
    if (r.kind != "matmul") continue;
    if (!header) {
      absl::StrAppendFormat(&table,
                            "\nGEMM GFLOP/s, y[n][out] = x[n][in] W^T, n = %d tokens, %d threads "
                            "(best of the timed calls)\n%-8s %12s %14s %14s %11s %10s\n",
                            r.n_tokens, r.threads, "proj", "out x in", "batch-inv f32",
                            "batch-inv bf16", "sgemm f32", "inv/sgemm");
      header = true;
    }
    absl::StrAppendFormat(&table, "%-8s %12s %14.1f %14.1f %11.1f %10.2f\n", r.projection,
                          absl::StrFormat("%dx%d", r.out, r.in), r.batch_invariant_gflops,
                          r.batch_invariant_bf16_gflops, r.sgemm_gflops, r.ratio);
  }
  return table;
}

absl::Status RunBenchPrefill(const BenchPrefillOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(const BenchPrefillReport report, MeasurePrefill(options));
  const std::string text = options.json ? BenchPrefillJson(report) : BenchPrefillTable(report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (options.json) std::fputc('\n', stdout);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace estuary
