#pragma once
// PrefillService: the prefill worker's gRPC service (worker.proto PrefillWorker; design §1 step
// 3). Owns the prefill engine, its thread (StepLoop) and the endpoints to decode workers. A
// Prefill call checks the descriptor's seal (the decode worker issued it as it is) and the KV
// format against the descriptor before any work, queues the prompt,
// pushes every layer of every chunk into the decode worker's reserved pages as the engine
// announces it (on the rank threads), and when the prompt is done flushes the pushes, sends the
// completion (first token, provenance) to the decode worker and answers. A failure at any point
// sends an abort completion instead, so the decode worker frees the reservation at once rather
// than at lease expiry; a client that cancels the call aborts the prompt the same way, and so
// does the reservation's lease: the prompt is aborted when the pusher's write deadline (the lease
// less a clock-skew margin, kvtransfer/README.md "Fencing") passes before it is done.
//
// Readiness and the drain (worker/worker_control.h): the process plumbing (ServeWorker) writes
// control(); GetLoad reports it as not_ready; while draining, new Prefill calls are refused with
// UNAVAILABLE (routers place them elsewhere); once ending, prompts still running are aborted and
// their calls end with UNAVAILABLE. Drained() says when no call is left.
//
// Thread-safety: every RPC may run concurrently on gRPC's threads.

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/step_loop.h"
#include "core/model/sharded_model.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/kv_pusher.h"
#include "kvtransfer/transport.h"
#include "prefill/prefill_engine.h"
#include "worker/worker_control.h"

namespace estuary {

struct PrefillServiceOptions {
  PrefillEngineOptions engine;
  std::string model_id;  // goes into the KV format fingerprint
  // Longest a request may take (queue, prefill and push) when its own deadline is later.
  absl::Duration request_timeout = absl::Minutes(5);
  // Prefill calls at once (queued and running); beyond, RESOURCE_EXHAUSTED with a retry hint
  // (WorkerProcessOptions::max_requests_in_flight).
  int max_requests_in_flight = 64 + 256;
  // Fault injection (--debug-step-delay, for tests that need a prefill under way: fencing,
  // drain, a prefill worker killed mid-prefill): every engine step that has work sleeps this
  // long first, on the engine thread, as a slow or stalled engine would.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // The key transfer descriptors must be sealed with (kvtransfer/descriptor_seal.h;
  // worker::KvDescriptorKey); empty: seals are not checked.
  std::string descriptor_key;
};

class PrefillService final : public estuary::v1::PrefillWorker::Service {
 public:
  // `model` and `transport` must outlive the service.
  static absl::StatusOr<std::unique_ptr<PrefillService>> Create(
      ShardedModel& model, kvtransfer::Transport& transport, const PrefillServiceOptions& options);
  ~PrefillService() override;

  grpc::Status Prefill(grpc::ServerContext* context, const estuary::v1::PrefillRequest* request,
                       estuary::v1::PrefillResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const estuary::v1::WorkerAbortRequest* request,
                     estuary::v1::WorkerAbortResponse* response) override;
  grpc::Status GetLoad(grpc::ServerContext* context, const estuary::v1::GetLoadRequest* request,
                       estuary::v1::WorkerLoad* response) override;
  grpc::Status GetInfo(grpc::ServerContext* context, const estuary::v1::GetInfoRequest* request,
                       estuary::v1::WorkerInfo* response) override;

  worker::WorkerControl& control() { return control_; }
  // The engine loop's progress (health).
  StepLoopProgress Progress() const { return loop_->Progress(); }
  // No Prefill call in flight (the drain is over).
  bool Drained();

  const estuary::v1::KvFormatFingerprint& fingerprint() const { return fingerprint_; }
  PrefillEngine& engine() { return *engine_; }

 private:
  struct Pending;  // one Prefill call in flight

  PrefillService(kvtransfer::Transport& transport, const PrefillServiceOptions& options,
                 estuary::v1::KvFormatFingerprint fingerprint);
  void OnLayerReady(const LayerReady& event);
  void OnDone(PrefillDone& done);
  std::shared_ptr<Pending> Find(const std::string& request_id);
  absl::Status StepOnce();

  kvtransfer::Transport& transport_;
  const PrefillServiceOptions options_;
  const estuary::v1::KvFormatFingerprint fingerprint_;
  const kvtransfer::DescriptorSeal seal_;  // checks every descriptor before it is used
  kvtransfer::EndpointCache endpoints_;
  // The decode workers' answers to our attaches: the only reader of the transport's inbox.
  kvtransfer::AttachReplies attach_replies_;
  worker::WorkerControl control_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  int64_t pending_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // their prompt tokens (the load)

  std::unique_ptr<PrefillEngine> engine_;
  std::unique_ptr<StepLoop> loop_;  // destroyed first: no step runs while the rest goes
};

}  // namespace estuary
