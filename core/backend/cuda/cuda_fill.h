#pragma once
// A first device kernel: fill `count` floats with `value` on `stream`. Returns the CUDA error
// code (0 = success) so that this header needs no CUDA or Abseil types.

#include <cstddef>

namespace estuary::cuda {

int LaunchFillF32(float* data, size_t count, float value, void* stream);

}  // namespace estuary::cuda
