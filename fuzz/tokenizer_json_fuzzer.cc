// libFuzzer target for the tokenizer.json loader: arbitrary bytes are a whole tokenizer.json.
// Whatever loads is used: a few fixed strings and the start of the input itself are encoded and
// decoded, and the results are checked for internal consistency (tokenizer_checks.h).
// Seeds: fuzz/corpus/tokenizer_json/. Run (see fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/tokenizer_json_fuzzer -max_total_time=60 fuzz/corpus/tokenizer_json

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/tokenizer/hf_tokenizer.h"
#include "fuzz/tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto tokenizer = estuary::ParseHfTokenizerJson(absl::string_view(input.data(), input.size()));
  if (!tokenizer.ok()) return 0;
  estuary::fuzz::CheckTokenizer(**tokenizer, input);
  return 0;
}
