#include "core/model/llama_model.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/worker_pool.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/loader/hf_writer.h"
#include "core/model/forward_batch.h"
#include "core/model/generator.h"
#include "core/model/kv_cache.h"
#include "core/model/model_loader.h"
#include "core/model/paged_kv_view.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

constexpr char kStories260K[] = "models/stories260K";

// Prefill of a whole prompt in one chunk and token-by-token decode must give the same logits:
// the GEMM and GEMV paths and the causal mask agree.
TEST(LlamaModelTest, ChunkedAndStepwiseForwardAgree) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383};
  const int vocab = model.config().vocab_size;

  auto cache_a = ContiguousKvCache::Create(model.config(), 16);
  auto cache_b = ContiguousKvCache::Create(model.config(), 16);
  ASSERT_TRUE(cache_a.ok() && cache_b.ok());
  std::vector<float> chunk_logits(vocab), step_logits(vocab);
  ASSERT_TRUE(model.Forward(prompt, 0, *cache_a, absl::MakeSpan(chunk_logits)).ok());
  for (size_t i = 0; i < prompt.size(); ++i) {
    ASSERT_TRUE(model.Forward({prompt[i]}, static_cast<int>(i), *cache_b,
                              absl::MakeSpan(step_logits))
                    .ok());
  }
  for (int i = 0; i < vocab; ++i) EXPECT_NEAR(chunk_logits[i], step_logits[i], 1e-4f) << i;
}

// What one forward pass leaves behind: the logits of both steps and every K/V slot written.
struct ForwardTrace {
  std::vector<float> logits;
  std::vector<float> kv;
};

// A prefill of two sequences (130 and 70 tokens, one batch) and then their decode step, on
// stories12L through paged KV, with the kernels on `pool` (null: the caller's thread).
ForwardTrace TracePrefillAndDecode(const LlamaModel& model, kernels::cpu::MatMulPath path,
                                   WorkerPool* pool) {
  const LlamaConfig& c = model.config();
  std::unique_ptr<KvPool> kv_pool =
      KvPool::Create(KvLayout::FromConfig(c, 16), int64_t{16} << 20).value();
  std::vector<int32_t> prompt(130);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 37 + 1) % static_cast<size_t>(c.vocab_size));
  }
  const std::vector<int> lengths = {130, 70};
  const std::vector<int32_t> next = {5, 7};
  std::vector<std::unique_ptr<SequenceKv>> sequences;
  std::vector<PagedKvView> views;
  views.reserve(2);
  for (int length : lengths) {
    sequences.push_back(std::make_unique<SequenceKv>(kv_pool.get()));
    EXPECT_TRUE(sequences.back()->Reserve(length + 1).ok());
    views.emplace_back(sequences.back().get());
  }
  ForwardOptions options;
  options.matmul = {path, pool};
  ForwardTrace trace;
  std::vector<float> logits(2 * static_cast<size_t>(c.vocab_size));
  std::vector<EntryOutcome> outcomes(2);
  for (const bool decode : {false, true}) {
    std::vector<BatchEntry> entries(2);
    for (size_t e = 0; e < 2; ++e) {
      entries[e].kv = &views[e];
      if (decode) {
        entries[e].tokens = absl::MakeConstSpan(&next[e], 1);
        entries[e].start_pos = lengths[e];
      } else {
        entries[e].tokens = absl::MakeConstSpan(prompt.data(), static_cast<size_t>(lengths[e]));
      }
    }
    EXPECT_TRUE(ForwardBatch(model, entries, options, absl::MakeSpan(logits),
                             absl::MakeSpan(outcomes))
                    .ok());
    trace.logits.insert(trace.logits.end(), logits.begin(), logits.end());
  }
  for (size_t e = 0; e < 2; ++e) {
    for (int layer = 0; layer < c.n_layers; ++layer) {
      for (int pos = 0; pos <= lengths[e]; ++pos) {
        for (int h = 0; h < c.n_kv_heads; ++h) {
          const float* k = sequences[e]->k_slot(layer, pos, h);
          const float* v = sequences[e]->v_slot(layer, pos, h);
          trace.kv.insert(trace.kv.end(), k, k + c.head_dim);
          trace.kv.insert(trace.kv.end(), v, v + c.head_dim);
        }
      }
    }
  }
  return trace;
}

// The rank's pool changes no bit of a forward pass: the matrix products (kBatchInvariant's
// batched GEMV; kFastest sends these 200-row chunks to sgemm), paged attention's (query, KV head)
// pairs, and the norms, RoPE and SwiGLU of a 200-row chunk split over it, each output element
// computed on one thread in the serial order. Bit-exactness rule: EXPECT_EQ on logits and KV.
TEST(LlamaModelTest, WorkerPoolGivesTheSerialBits) {
  auto loaded = LoadModel("models/stories12L");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  WorkerPool two(2);
  for (const auto path : {kernels::cpu::MatMulPath::kFastest,
                          kernels::cpu::MatMulPath::kBatchInvariant}) {
    const ForwardTrace serial = TracePrefillAndDecode(*loaded->model, path, nullptr);
    const ForwardTrace split = TracePrefillAndDecode(*loaded->model, path, &two);
    ASSERT_FALSE(serial.logits.empty());
    EXPECT_EQ(serial.logits, split.logits) << static_cast<int>(path);
    EXPECT_EQ(serial.kv, split.kv) << static_cast<int>(path);
  }
}

TEST(LlamaModelTest, RejectsBadTokensAndPositions) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  auto cache = ContiguousKvCache::Create(model.config(), 4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(model.config().vocab_size);
  EXPECT_EQ(model.Forward({100000}, 0, *cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Forward({1, 2, 3, 4, 5}, 0, *cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeneratorTest, ValidatesRequests) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GenerateRequest request;
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.prompt_ids = {1, 9999};
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.prompt_ids = {1};
  request.sampling.top_p = 2.0f;
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeneratorTest, SeededSamplingIsReproducibleAndStopsAtMaxTokens) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GenerateRequest request;
  request.prompt_ids = {1, 403, 407, 261, 378};
  request.max_tokens = 20;
  request.ignore_eos = true;
  request.sampling.temperature = 1.0f;
  request.sampling.top_p = 0.9f;
  request.sampling.seed = 1234;
  auto a = Generate(*loaded->model, request);
  auto b = Generate(*loaded->model, request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->completion_ids, b->completion_ids);
  EXPECT_EQ(a->completion_ids.size(), 20u);
  EXPECT_EQ(a->finish_reason, FinishReason::kLength);
}

TEST(ModelLoaderTest, ConvertsToBf16AndKeepsTheHeadTied) {
  LoadOptions options;
  options.dtype = DType::kBF16;
  auto loaded = LoadModel(kStories260K, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaWeights& w = loaded->model->weights();
  EXPECT_EQ(w.layers[0].wq.dtype(), DType::kBF16);
  EXPECT_EQ(w.lm_head.raw(), w.embedding.raw());
}

// The file /proc/self/maps names for the mapping that holds `p` ("" for anonymous memory).
std::string MappingOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode >> path;
    const size_t dash = range.find('-');
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (address >= begin && address < end) return path;
  }
  return "(unmapped)";
}

// By default the weights leave the file mapping (page-cache pages are 4 KiB: slow to stream)
// for the loader's own memory; with copy_mapped_weights off they stay in the mapping. Both give
// the same logits.
TEST(ModelLoaderTest, WeightsAreCopiedOutOfTheFileMappingUnlessAskedNotTo) {
  auto resident = LoadModel(kStories260K);
  ASSERT_TRUE(resident.ok()) << resident.status();
  LoadOptions mapped_options;
  mapped_options.copy_mapped_weights = false;
  auto mapped = LoadModel(kStories260K, mapped_options);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const LlamaWeights& r = resident->model->weights();
  const LlamaWeights& m = mapped->model->weights();
  EXPECT_NE(MappingOf(m.layers[0].wq.raw()).find("model.bin"), std::string::npos);
  EXPECT_NE(MappingOf(m.embedding.raw()).find("model.bin"), std::string::npos);
  for (const Tensor* t : {&r.embedding, &r.final_norm, &r.layers[0].wq, &r.layers[0].w_down,
                          &r.layers.back().attn_norm}) {
    EXPECT_EQ(MappingOf(t->raw()).find("model.bin"), std::string::npos) << t->DebugString();
  }
  EXPECT_EQ(r.lm_head.raw(), r.embedding.raw());  // still tied
  EXPECT_TRUE(m.layers[0].wq.in_file_mapping());
  EXPECT_FALSE(r.layers[0].wq.in_file_mapping());

  const int vocab = resident->model->config().vocab_size;
  std::vector<float> logits_r(vocab), logits_m(vocab);
  const std::vector<int32_t> prompt = {1, 403, 407};
  auto cache_r = ContiguousKvCache::Create(resident->model->config(), 8);
  auto cache_m = ContiguousKvCache::Create(mapped->model->config(), 8);
  ASSERT_TRUE(cache_r.ok() && cache_m.ok());
  ASSERT_TRUE(resident->model->Forward(prompt, 0, *cache_r, absl::MakeSpan(logits_r)).ok());
  ASSERT_TRUE(mapped->model->Forward(prompt, 0, *cache_m, absl::MakeSpan(logits_m)).ok());
  EXPECT_EQ(logits_r, logits_m);
}

// The same from a Hugging Face folder (safetensors views of the file).
TEST(ModelLoaderTest, HuggingFaceWeightsLeaveTheMappingUnlessAskedNotTo) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "estuary_model_loader_hf" / "stories260K";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(ConvertLlama2cToHf(kStories260K, dir.string(), DType::kF32).ok());
  LoadOptions mapped_options;
  mapped_options.copy_mapped_weights = false;
  auto mapped = LoadModel(dir.string(), mapped_options);
  auto resident = LoadModel(dir.string());
  ASSERT_TRUE(mapped.ok() && resident.ok());
  const LlamaLayerWeights& m = mapped->model->weights().layers[0];
  const LlamaLayerWeights& r = resident->model->weights().layers[0];
  for (const Tensor* t : {&m.wq, &m.wk, &m.w_down}) {
    EXPECT_TRUE(t->in_file_mapping()) << t->DebugString();
    EXPECT_NE(MappingOf(t->raw()).find("model.safetensors"), std::string::npos);
  }
  for (const Tensor* t : {&r.wq, &r.wk, &r.wv, &r.wo, &r.w_gate, &r.w_up, &r.w_down}) {
    EXPECT_FALSE(t->in_file_mapping()) << t->DebugString();
    EXPECT_EQ(MappingOf(t->raw()).find("model.safetensors"), std::string::npos);
  }
  std::filesystem::remove_all(dir.parent_path());
}

TEST(ModelLoaderTest, MissingPathIsNotFound) {
  EXPECT_EQ(LoadModel("/nonexistent/model").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace estuary
