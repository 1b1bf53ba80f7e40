// libFuzzer target for the llama2.c files of a model folder, read through the loaders' own entry
// points (a memfd stands in for the file, memory_file.h). The first byte picks the file:
//   0: model.bin (the rest of the input): LoadLlama2cCheckpoint. Whatever loads must have a
//      config that validates, as many layers as it says, and ReadLlama2cConfig (the router's
//      28-byte read) must give the same dimensions;
//   1: tokenizer.bin: the next two bytes (little-endian) give the model's vocabulary size as
//      259 + value (259 = <unk>, BOS, EOS and the 256 byte fallbacks), the rest is the file:
//      LoadLlama2cTokenizer; whatever loads is used (tokenizer_checks.h).
// Seeds: fuzz/corpus/llama2c_files/ (a valid tiny model and stories260K's tokenizer, and the
// hostile shapes of reliability.md C11/C12: huge counts and lengths, overflowing dims, a file
// shorter or longer than its header says). Run (see fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/llama2c_files_fuzzer -max_total_time=60 fuzz/corpus/llama2c_files

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/loader/llama2c_checkpoint.h"
#include "core/loader/llama2c_config.h"
#include "core/tokenizer/llama2c_tokenizer.h"
#include "fuzz/memory_file.h"
#include "fuzz/tokenizer_checks.h"

namespace {

void FuzzModelBin(const uint8_t* data, size_t size) {
  const estuary::fuzz::MemoryFile file(data, size);
  auto checkpoint = estuary::LoadLlama2cCheckpoint(file.path());
  if (!checkpoint.ok()) return;
  const estuary::LlamaConfig& c = checkpoint->config;
  if (!c.Validate().ok()) __builtin_trap();
  if (checkpoint->weights.layers.size() != static_cast<size_t>(c.n_layers)) __builtin_trap();
  auto header_only = estuary::ReadLlama2cConfig(file.path());
  if (!header_only.ok() || header_only->dim != c.dim || header_only->n_layers != c.n_layers ||
      header_only->vocab_size != c.vocab_size || header_only->max_seq_len != c.max_seq_len) {
    __builtin_trap();
  }
}

void FuzzTokenizerBin(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const int32_t vocab_size = estuary::kLlama2cMinVocabSize + (data[0] | (data[1] << 8));
  const estuary::fuzz::MemoryFile file(data + 2, size - 2);
  auto tokenizer = estuary::LoadLlama2cTokenizer(file.path(), vocab_size);
  if (!tokenizer.ok()) return;
  if ((*tokenizer)->vocab_size() != vocab_size) __builtin_trap();
  estuary::fuzz::CheckTokenizer(
      **tokenizer, std::string_view(reinterpret_cast<const char*>(data + 2), size - 2));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 2) {
    case 0:
      FuzzModelBin(data + 1, size - 1);
      break;
    case 1:
      FuzzTokenizerBin(data + 1, size - 1);
      break;
  }
  return 0;
}
