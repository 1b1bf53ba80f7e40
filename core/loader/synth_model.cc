// SynthesizeModel (declared in hf_writer.h): random-weight Hugging Face Llama folders.

#include <cmath>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/logging.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_tensor_names.h"
#include "core/loader/hf_writer.h"
#include "core/loader/safetensors_writer.h"
#include "core/tensor/half_float.h"
#include "core/tokenizer/tokenizer_json_export.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

namespace fs = std::filesystem;

// Hugging Face's default max_shard_size ("5GB").
constexpr uint64_t kMaxShardBytes = 5'000'000'000;
constexpr size_t kChunkElements = size_t{1} << 20;

}  // namespace

absl::StatusOr<LlamaConfig> SynthPresetConfig(absl::string_view preset) {
  LlamaConfig c;
  c.rope_style = RopeStyle::kHalves;
  c.rms_eps = 1e-5f;
  if (preset == "tiny") {
    c.dim = 64;
    c.hidden_dim = 172;
    c.n_layers = 2;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 8;
    c.vocab_size = 512;
    c.max_seq_len = 512;
    c.rope_theta = 10000.0f;
    c.tied_embeddings = false;  // exercises lm_head; the llama2.c models cover the tied case
    c.bos_id = 510;
    c.eos_ids = {511};
  } else if (preset == "small") {
    // Widths four times stories12L's (dim, head_dim): `estuary widen`'s test target, where every
    // scale of the widening is a power of two.
    c.dim = 512;
    c.hidden_dim = 1024;
    c.n_layers = 2;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 64;
    c.vocab_size = 512;
    c.max_seq_len = 512;
    c.rope_theta = 10000.0f;
    c.tied_embeddings = false;
    c.bos_id = 510;
    c.eos_ids = {511};
  } else if (preset == "llama-3.2-1b" || preset == "llama-1b-v512") {
    // llama-1b-v512: the 1B decoder with a 512-token vocabulary, so that benchmarks measure the
    // layers (issue 18's reference shape: 975M parameters, all but 1M of them in the layers)
    // rather than a 128256 x 2048 LM head.
    c.dim = 2048;
    c.hidden_dim = 8192;
    c.n_layers = 16;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.vocab_size = 128256;
    c.max_seq_len = 131072;
    c.rope_theta = 500000.0f;
    c.rope_scaling = {true, 32.0f, 1.0f, 4.0f, 8192};
    c.tied_embeddings = true;
    c.bos_id = 128000;
    c.eos_ids = {128001};
    if (preset == "llama-1b-v512") {
      c.vocab_size = 512;  // the tiny preset's byte-level tokenizer and special ids
      c.bos_id = 510;
      c.eos_ids = {511};
    }
  } else if (preset == "llama-3.1-8b") {
    c.dim = 4096;
    c.hidden_dim = 14336;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.max_seq_len = 131072;
    c.rope_theta = 500000.0f;
    c.rope_scaling = {true, 8.0f, 1.0f, 4.0f, 8192};
    c.tied_embeddings = false;
    c.bos_id = 128000;
    c.eos_ids = {128001, 128008, 128009};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("synth: unknown preset '", preset,
                                                   "'; valid: tiny, small, llama-3.2-1b, llama-1b-v512, llama-3.1-8b"));
  }
  c.name = std::string(preset);
  ESTUARY_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// SplitMix64: fast, seedable, good enough for weights.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// Streams the bf16 values of one tensor: ones for norms, otherwise roughly normal with standard
// deviation 1/sqrt(fan_in) (a sum of four 16-bit uniforms, rescaled).
absl::Status AppendRandomTensor(SafetensorsStreamWriter& writer, const HfTensorInfo& info,
                                uint64_t seed, size_t index) {
  SplitMix64 rng(seed ^ (0xd1b54a32d192ed03ull * (index + 1)));
  const int64_t numel = info.is_norm() ? info.shape[0] : info.shape[0] * info.shape[1];
  const double stddev = info.is_norm() ? 0.0 : 1.0 / std::sqrt(double(info.shape[1]));
  const float scale = static_cast<float>(stddev * std::sqrt(3.0) / 65536.0);
  std::vector<uint16_t> chunk(kChunkElements);
  for (int64_t done = 0; done < numel;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(numel - done, kChunkElements));
    if (info.is_norm()) {
      std::fill_n(chunk.begin(), n, F32ToBf16(1.0f));
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng.Next();
        const int64_t sum = int64_t(r & 0xffff) + int64_t((r >> 16) & 0xffff) +
                            int64_t((r >> 32) & 0xffff) + int64_t(r >> 48) - 131070;
        chunk[i] = F32ToBf16(static_cast<float>(sum) * scale);
      }
    }
    ESTUARY_RETURN_IF_ERROR(
        writer.Append(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(chunk.data()), n * 2)));
    done += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

uint64_t TensorBytes(const HfTensorInfo& info) {
  uint64_t n = 2;
  for (int64_t d : info.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

absl::Status SynthesizeModel(absl::string_view preset, const std::string& out_dir, uint64_t seed) {
  ESTUARY_ASSIGN_OR_RETURN(LlamaConfig config, SynthPresetConfig(preset));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  const fs::path out(out_dir);
  ESTUARY_RETURN_IF_ERROR(WriteHfConfig(out_dir, config, DType::kBF16));
  const std::string tokenizer_json =
      MakeByteLevelTokenizerJson(config.vocab_size, config.bos_id, config.eos_ids[0]);
  if (tokenizer_json.empty()) {
    return absl::InternalError(absl::StrCat("synth ", config.name, ": no tokenizer for its ids"));
  }
  ESTUARY_RETURN_IF_ERROR(WriteStringToFile((out / "tokenizer.json").string(), tokenizer_json));

  // Plan shards: consecutive tensors up to kMaxShardBytes each.
  const std::vector<HfTensorInfo> infos = HfLlamaTensors(config);
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const uint64_t bytes = TensorBytes(infos[i]);
    if (shard_bytes > 0 && shard_bytes + bytes > kMaxShardBytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  auto shard_name = [&](size_t s) {
    return shards.size() == 1
               ? std::string("model.safetensors")
               : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
  };

  ESTUARY_LOG(INFO) << "synth " << config.name << ": " << infos.size() << " tensors, "
                    << total_bytes / 1e9 << " GB of bf16 in " << shards.size() << " file(s) under "
                    << out_dir;
  uint64_t done_bytes = 0;
  int last_percent = -10;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i : shards[s]) {
      specs.push_back({infos[i].name, DType::kBF16, infos[i].shape});
      weight_map[infos[i].name] = shard_name(s);
    }
    ESTUARY_ASSIGN_OR_RETURN(
        auto writer,
        SafetensorsStreamWriter::Create((out / shard_name(s)).string(), specs, {{"format", "pt"}}));
    for (size_t i : shards[s]) {
      ESTUARY_RETURN_IF_ERROR(AppendRandomTensor(*writer, infos[i], seed, i));
      done_bytes += TensorBytes(infos[i]);
      const int percent = static_cast<int>(100 * done_bytes / total_bytes);
      if (percent >= last_percent + 10) {
        last_percent = percent;
        ESTUARY_LOG(INFO) << "synth " << config.name << ": " << percent << "% (" << shard_name(s)
                          << ")";
      }
    }
    ESTUARY_RETURN_IF_ERROR(writer->Finish());
  }
  if (shards.size() == 1) {
    fs::remove(out / "model.safetensors.index.json", ec);  // stale from an earlier run
  } else {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes}}},
                                    {"weight_map", std::move(weight_map)}};
    ESTUARY_RETURN_IF_ERROR(
        WriteStringToFile((out / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace estuary
