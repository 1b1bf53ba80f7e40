#pragma once
// DecodeEngine::Sequence: one request's state in the decode engine, shared by the engine's
// files (decode_engine.cc: scheduling, prefill and decode; lossless_step.cc: lossless rounds;
// decode_reservations.cc: reservations, with Reserved and Fenced below).
// Internal to the engine: nothing else includes this.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/lossless_round.h"
#include "core/sampling/sampler.h"
#include "decode/decode_engine.h"

namespace estuary {

// One request's state, owned by the engine thread.
struct DecodeEngine::Sequence {
  Sequence(DecodeRequest r, KvPool* pool, int64_t arrival_order, float threshold,
           std::vector<int32_t> eos_ids)
      : request(std::move(r)),
        tokens(request.prompt_ids),
        generated(request.resumed_output),
        resumed(request.resumed_output),
        sampler(request.sampling, std::move(eos_ids)),
        kv(pool),
        arrival(arrival_order),
        exit_threshold(threshold) {}

  // Whether this engine sampled a token of the sequence yet (a resumed stream's output that came
  // in the prompt does not count: it is prefilled like the prompt).
  bool SampledHere() const { return generated > resumed; }
  // Tokens whose KV must be present before the next decode step: all but the last token sampled
  // here (which the step feeds), or the whole prompt before the first one.
  int PrefillTarget() const {
    return static_cast<int>(tokens.size()) - (SampledHere() ? 1 : 0);
  }
  bool NeedsPrefill() const { return kv.length() < PrefillTarget(); }

  DecodeRequest request;
  std::vector<int32_t> tokens;  // prompt, then every generated token
  // Output tokens so far, those that came in a resumed stream's prompt included: the sampler's
  // output position, and what max_tokens bounds.
  int generated = 0;
  const int resumed;  // request.resumed_output
  Sampler sampler;
  SequenceKv kv;
  int64_t arrival;
  float exit_threshold;
  bool finished = false;
  bool preempted = false;
  // Lossless requests (DecodeRequest::lossless): their rounds (decode/lossless_step.cc).
  std::unique_ptr<LosslessRound> round;
};

// A sequence whose prompt KV is being pushed by a writer (a prefill worker).
struct DecodeEngine::Reserved {
  std::unique_ptr<Sequence> sequence;
  std::vector<int32_t> pages;  // as Reserve issued them (the descriptor's page ids); immutable
  absl::Time lease_deadline;
  uint64_t epoch = 0;
  uint64_t writer = 0;       // the attached writer's id; 0: none attached
  bool aborted = false;      // Abort() came: writers are refused, the engine thread ends it
  bool tainted = false;      // a stale writer may have written its pages: recompute its prompt
  SampledToken first_token;  // from the writer's completion
  absl::Status end_status;   // writer_ended_: why the request ends
};

// A reservation whose request ended while its writer may still write its pages.
struct DecodeEngine::Fenced {
  std::unique_ptr<Sequence> sequence;  // finished; holds the pages
  uint64_t writer = 0;
  absl::Time release_at;               // lease + grace
  bool confirmed = false;              // the writer's completion arrived: give the pages back
};

}  // namespace estuary
