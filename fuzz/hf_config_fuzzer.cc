// libFuzzer target for a Hugging Face config.json (and generation_config.json): arbitrary bytes
// are the file. What parses and validates must survive a round trip: HfConfigJson writes it back
// and ParseHfConfigJson reads the same dimensions. The same bytes as a generation_config.json
// applied to a valid config either fail or leave a config whose BOS / EOS ids are checked by
// Validate like any other.
// Seeds: fuzz/corpus/hf_config/ (Llama 3.2 1B's config, a llama3 rope_scaling, and hostile
// shapes: huge and negative dims, overflowing products, wrong types, deep nesting). Run (see
// fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/hf_config_fuzzer -max_total_time=60 fuzz/corpus/hf_config

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/loader/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  auto config = estuary::ParseHfConfigJson(json, "config.json");
  if (config.ok() && config->Validate().ok()) {
    const std::string written = estuary::HfConfigJson(*config, estuary::DType::kBF16);
    auto again = estuary::ParseHfConfigJson(written, "written config.json");
    if (!again.ok() || again->dim != config->dim || again->hidden_dim != config->hidden_dim ||
        again->n_layers != config->n_layers || again->n_heads != config->n_heads ||
        again->n_kv_heads != config->n_kv_heads || again->head_dim != config->head_dim ||
        again->vocab_size != config->vocab_size || again->max_seq_len != config->max_seq_len ||
        again->tied_embeddings != config->tied_embeddings) {
      __builtin_trap();
    }
  }
  estuary::LlamaConfig base;
  base.dim = 64;
  base.hidden_dim = 128;
  base.n_layers = 2;
  base.n_heads = 4;
  base.n_kv_heads = 2;
  base.head_dim = 16;
  base.vocab_size = 512;
  base.max_seq_len = 256;
  if (estuary::ApplyHfGenerationConfigJson(json, "generation_config.json", base).ok()) {
    (void)base.Validate();
  }
  return 0;
}
