#include "core/loader/llama2c_config.h"

#include <array>
#include <climits>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace estuary {
namespace {

constexpr int64_t kHeaderBytes = 7 * 4;

std::string FolderName(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  return p.lexically_normal().parent_path().filename().string();
}

}  // namespace

// The config a llama2.c header describes (the 7 int32 at the start of model.bin).
absl::StatusOr<LlamaConfig> ConfigFromLlama2cHeader(const int32_t (&header)[7],
                                             const std::string& model_bin_path) {
  const auto [dim, hidden_dim, n_layers, n_heads, n_kv_heads, raw_vocab, seq_len] =
      std::to_array(header);
  LlamaConfig config;
  config.dim = dim;
  config.hidden_dim = hidden_dim;
  config.n_layers = n_layers;
  config.n_heads = n_heads;
  config.n_kv_heads = n_kv_heads;
  // A negative vocab_size flags an untied classifier; INT32_MIN has no positive counterpart.
  config.vocab_size = raw_vocab == INT32_MIN ? 0 : (raw_vocab < 0 ? -raw_vocab : raw_vocab);
  config.max_seq_len = seq_len;
  config.rms_eps = 1e-5f;
  config.rope_theta = 10000.0f;
  config.rope_style = RopeStyle::kInterleaved;
  config.tied_embeddings = raw_vocab > 0;
  config.bos_id = 1;
  // llama2.c's run.c ends generation at BOS (id 1), which delimits stories in its training
  // data, so BOS is an end-of-sequence id for these models alongside EOS (2). A converted
  // Hugging Face folder carries both in generation_config.json.
  config.eos_ids = {2, 1};
  config.name = FolderName(model_bin_path);
  if (dim >= 1 && n_heads >= 1) {
    if (dim % n_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(model_bin_path, ": header dim = ", dim,
                                                     " is not a multiple of n_heads = ", n_heads));
    }
    config.head_dim = dim / n_heads;
  }  // otherwise Validate() names the bad field
  if (absl::Status s = config.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(model_bin_path, ": ", s.message()));
  }
  return config;
}

absl::StatusOr<LlamaConfig> ReadLlama2cConfig(const std::string& model_bin_path) {
  std::ifstream in(model_bin_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(model_bin_path, ": cannot open"));
  int32_t header[7];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (in.gcount() != static_cast<std::streamsize>(sizeof(header))) {
    return absl::DataLossError(absl::StrCat(model_bin_path, ": shorter than the ", kHeaderBytes,
                                            "-byte llama2.c header"));
  }
  return ConfigFromLlama2cHeader(header, model_bin_path);
}

}  // namespace estuary
