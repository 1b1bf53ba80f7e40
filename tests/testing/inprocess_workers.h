#pragma once
// InProcessWorkers: a decode worker and a prefill worker (their real gRPC services, on one
// server on a free loopback port) in the test's own process, over the in-process KV transport,
// each with its own copy of a shipped model. For tests of the push protocol and the router that
// need the workers' behaviour but not separate processes (tests/e2e has those).

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/model/sharded_model.h"
#include "decode/decode_service.h"
#include "kvtransfer/transport.h"
#include "prefill/prefill_service.h"
#include "rpc/grpc_server.h"

namespace estuary::testing {

struct InProcessWorkersOptions {
  std::string model = "stories260K";  // under models/ (GoldenModelDir)
  // The prefill worker's transport (e.g. a FaultTransport); default: in-process.
  std::unique_ptr<kvtransfer::Transport> prefill_transport;
  absl::Duration lease = absl::Seconds(30);
  // DecodeEngineOptions::lease_grace: how long past its lease a reservation with a writer that
  // went silent keeps its pages.
  absl::Duration lease_grace = absl::Seconds(1);
};

class InProcessWorkers {
 public:
  explicit InProcessWorkers(InProcessWorkersOptions options);
  ~InProcessWorkers();

  DecodeService& decode() { return *decode_; }
  PrefillService& prefill() { return *prefill_; }
  const LlamaConfig& config() const { return decode_model_->config(); }
  const std::string& model_id() const { return model_id_; }
  // host:port of the server holding both services.
  const std::string& address() const { return server_.address; }
  // The decode pool's free and evictable pages.
  int DecodeFreePages();

 private:
  std::string model_id_;
  std::unique_ptr<ShardedModel> decode_model_, prefill_model_;
  std::unique_ptr<kvtransfer::Transport> decode_transport_, prefill_transport_;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<PrefillService> prefill_;
  rpc::RunningServer server_;
};

}  // namespace estuary::testing
