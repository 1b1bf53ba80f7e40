#pragma once
// What every checkpoint loader returns, and how it reports progress.

#include <cstdint>
#include <functional>
#include <string>

#include "core/model/llama_config.h"
#include "core/model/llama_weights.h"

namespace estuary {

// A loaded model: its hyper-parameters and its weights. The weights usually share storage with
// memory-mapped files (read-only mappings: never write through them); the mappings stay alive
// as long as any tensor refers to them.
struct LlamaCheckpoint {
  LlamaConfig config;
  LlamaWeights weights;
};

struct LoadProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  std::string stage;  // what is being loaded now, e.g. a shard's file name
};

// Called on the loading thread; must not throw.
using ProgressCallback = std::function<void(const LoadProgress&)>;

}  // namespace estuary
