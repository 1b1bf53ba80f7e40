#pragma once
// DecodeService: the decode worker's gRPC service (worker.proto DecodeWorker; design §1 steps
// 2 and 4). Owns the decode engine, its thread (StepLoop), the per-request token streams, and
// the KV receiver that registers the engine's pool with the transport and turns the prefill
// workers' completion messages into CompleteReservation calls.
//
// Reserve takes pages under a lease and answers with the transfer descriptor (sealed with the
// cluster's key; a writer's attach must then hold exactly that descriptor); Decode streams a
// request's tokens (a reserved one, or one prefilled here when `local_prefill` is set); Abort
// ends a request wherever it is, at once (a reservation's pages come back once its writer
// confirmed, or at lease + grace: kvtransfer/README.md "Fencing"); GetLoad reports the figures
// heartbeats carry. A client that cancels its Decode stream aborts the request and frees its
// pages.
//
// Readiness and the drain (worker/worker_control.h): the process plumbing (ServeWorker) writes
// control(); GetLoad reports it as not_ready; while draining, new work (Reserve, a local-prefill
// Decode) is refused with UNAVAILABLE so that routers place it elsewhere; once ending, the Decode
// streams still open end with UNAVAILABLE. Drained() says when nothing is left in flight.
//
// Thread-safety: every RPC may run concurrently on gRPC's threads.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/model/sharded_model.h"
#include "decode/decode_engine.h"
#include "core/common/step_loop.h"
#include "decode/token_streams.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/transport.h"
#include "worker/worker_control.h"

namespace estuary {

struct DecodeServiceOptions {
  DecodeEngineOptions engine;
  std::string model_id;                            // goes into the KV format fingerprint
  absl::Duration default_lease = absl::Seconds(30);  // Reserve's lease when the request sets none
  absl::Duration max_lease = absl::Minutes(10);
  // Fault injection (--debug-step-delay, for health and drain tests): every engine step that has
  // work sleeps this long first, on the engine thread, as a slow or stalled engine would.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // The exit mode of requests that name none (EXIT_MODE_UNSPECIFIED): --exit-mode.
  bool default_lossless = false;
  // Requests open at once (reserved, waiting, running): beyond, Reserve and a local-prefill
  // Decode answer RESOURCE_EXHAUSTED with a retry hint (WorkerProcessOptions).
  int max_requests_in_flight = 64 + 256;
  // The key every transfer descriptor is sealed with (kvtransfer/descriptor_seal.h;
  // worker::KvDescriptorKey); empty: descriptors go unsealed.
  std::string descriptor_key;
};

class DecodeService final : public estuary::v1::DecodeWorker::Service {
 public:
  // `model` and `transport` must outlive the service.
  static absl::StatusOr<std::unique_ptr<DecodeService>> Create(ShardedModel& model,
                                                               kvtransfer::Transport& transport,
                                                               const DecodeServiceOptions& options);
  ~DecodeService() override;

  grpc::Status Reserve(grpc::ServerContext* context, const estuary::v1::ReserveRequest* request,
                       estuary::v1::ReserveResponse* response) override;
  grpc::Status Decode(grpc::ServerContext* context, const estuary::v1::DecodeRequest* request,
                      grpc::ServerWriter<estuary::v1::DecodeResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const estuary::v1::WorkerAbortRequest* request,
                     estuary::v1::WorkerAbortResponse* response) override;
  grpc::Status GetLoad(grpc::ServerContext* context, const estuary::v1::GetLoadRequest* request,
                       estuary::v1::WorkerLoad* response) override;
  grpc::Status GetInfo(grpc::ServerContext* context, const estuary::v1::GetInfoRequest* request,
                       estuary::v1::WorkerInfo* response) override;

  worker::WorkerControl& control() { return control_; }
  // The engine loop's progress (health).
  StepLoopProgress Progress() const { return loop_->Progress(); }
  // No stream open and no reservation waiting for its KV (the drain is over).
  bool Drained() const;

  const estuary::v1::KvFormatFingerprint& fingerprint() const { return fingerprint_; }
  DecodeEngine& engine() { return *engine_; }

 private:
  DecodeService(const DecodeServiceOptions& options, estuary::v1::KvFormatFingerprint fingerprint);
  // A writer's completion (the KV receiver's thread); `writer` is its transport id.
  void OnCompletion(const estuary::v1::KvCompletion& completion, uint64_t writer);
  // One engine step and a fresh load snapshot; runs on the loop's thread.
  absl::Status StepOnce();

  const DecodeServiceOptions options_;
  const estuary::v1::KvFormatFingerprint fingerprint_;
  worker::WorkerControl control_;
  TokenStreams streams_;
  // Destroyed in reverse: the receiver stops delivering completions, then the loop stops, then
  // the engine (and its pool, which the receiver had registered) goes.
  std::unique_ptr<DecodeEngine> engine_;
  mutable absl::Mutex load_mu_;
  estuary::v1::WorkerLoad load_ ABSL_GUARDED_BY(load_mu_);
  // ExitStats histogram already fed to estuary:backbone_layers_per_token (loop's thread).
  std::vector<int64_t> reported_layers_;
  std::unique_ptr<StepLoop> loop_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
};

}  // namespace estuary
