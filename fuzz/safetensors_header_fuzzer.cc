// libFuzzer target for the safetensors header parser: arbitrary bytes are a whole file.
// Seeds: fuzz/corpus/safetensors_header/. Run (see fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/safetensors_header_fuzzer -max_total_time=60 fuzz/corpus/safetensors_header

#include <cstddef>
#include <cstdint>

#include "core/loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = estuary::ParseSafetensorsHeader(absl::MakeConstSpan(data, size), "fuzz");
  if (header.ok()) {
    // Whatever parses must describe tensors that lie inside the input, back to back.
    uint64_t covered = 0;
    for (const estuary::SafetensorsEntry& entry : header->tensors) {
      if (entry.begin != covered || entry.end < entry.begin ||
          header->data_start + entry.end > size) {
        __builtin_trap();
      }
      covered = entry.end;
    }
    if (header->data_start + covered != size) __builtin_trap();
  }
  return 0;
}
