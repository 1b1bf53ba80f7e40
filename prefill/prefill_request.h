#pragma once
// What the prefill engine takes in (PrefillRequest) and gives out (LayerReady, PrefillDone) and
// the sink that receives them. The prefill worker's service converts its protos to and from
// these at the edge; the KV-transfer layer consumes the events (design §1 step 3, §7).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/kvcache/sequence_kv.h"
#include "core/sampling/sampler.h"

namespace estuary {

struct PrefillRequest {
  std::string request_id;           // unique among live requests of the engine
  std::vector<int32_t> prompt_ids;  // non-empty, inside the vocabulary, shorter than the context
  SamplingParams sampling;          // samples the first token from the last position's logits
  std::optional<absl::Time> deadline;   // DEADLINE_EXCEEDED when it passes before the prompt is done
  std::optional<float> exit_threshold;  // τ with prefill_exit; the engine's default when unset
  // A resumed (migrated) stream: the last `resumed_output` prompt ids are output generated
  // elsewhere, so the first token is sampled at that output position (the seeded random stream,
  // the penalties and min_tokens count them: WorkerRequest.resumed_output_tokens). In
  // [0, prompt_ids.size()).
  int resumed_output = 0;
};

// One layer of one prompt chunk is in the pool on one TP rank: positions [first_pos, end_pos) of
// layer `layer` in shard `rank` are final and may be pushed. `pages` are the sequence's page ids
// covering those positions, i.e. its page table entries [first_page, first_page + pages.size());
// a page id names the same slots on every rank (design §4, §6). Pages are the sequence's until
// its PrefillDone: the transfer layer may read them from the moment this event arrives.
struct LayerReady {
  std::string request_id;
  int rank = 0;
  int layer = 0;
  int first_pos = 0;  // inclusive
  int end_pos = 0;    // exclusive
  int first_page = 0;  // index of pages[0] in the sequence's page table
  std::vector<int32_t> pages;
};

// A prompt is finished (status OK) or failed (aborted, deadline, model error, no room).
//
// Ownership: `kv` owns the sequence's pages (one reference each on the engine's pool); moving it
// out of the event hands them to the consumer, who keeps them alive until the transfer has read
// them and then drops (or Release()s) it. If the consumer lets the event go without moving `kv`,
// the pages go back to the pool when the sink returns. A failed request's event carries whatever
// pages it held (possibly some of them already announced in LayerReady), so a transport still
// reading them can cancel first; it may be empty. `pool` keeps the engine's pool alive while the
// event lives, so an event may outlive the engine; a consumer that moves `kv` out should keep
// `pool` (a shared reference) with it for the same reason.
struct PrefillDone {
  std::string request_id;
  absl::Status status;            // OK; CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ...
  int32_t first_token = -1;       // sampled from the last prompt position's logits (OK only)
  std::optional<TokenLogprobs> first_token_logprobs;  // when the request asked for logprobs
  int num_tokens = 0;             // prompt positions whose KV is in `pages` (the prompt on OK)
  std::vector<int32_t> pages;     // the page table: position p is in pages[p / block_size]
  std::vector<uint8_t> provenance;  // per position < num_tokens: last backbone layer, or
                                    // kProvenanceFullDepth (kv_pool.h)
  std::vector<int> chunk_backbone_layers;  // backbone layers each chunk ran (n_layers: full)
  std::shared_ptr<KvPool> pool;   // the pool `kv` holds pages of; declared first, dies last
  SequenceKv kv{nullptr};         // the pages themselves (see Ownership above)
};

// Where events go. `on_layer_ready` is called on the TP rank threads, *concurrently* for
// different ranks (rank 0 may be the engine thread), in layer order per rank and chunk; it must
// be thread-safe, quick (it runs between layers of the forward pass) and must not call back into
// the engine. `on_done` is called on the engine thread (inside Step()), once per request, after
// every LayerReady of that request; it may move `kv` out. It must not call back into the engine
// either. Either may be empty.
struct PrefillSink {
  std::function<void(const LayerReady&)> on_layer_ready;
  std::function<void(PrefillDone&)> on_done;
};

}  // namespace estuary
