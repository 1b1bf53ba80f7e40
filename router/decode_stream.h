#pragma once
// DecodeStream: one DecodeWorker.Decode call on gRPC's callback API (a ClientReadReactor). It
// reads the worker's responses one after another, hands each to its owner, and then the call's
// end status; no thread waits on it in between. It reads on as soon as the owner took a response
// (the owner queues what the client has not taken yet; a stream is bounded by its max_tokens),
// and deletes itself once gRPC is done with it. The owner cancels it through the ClientContext
// it shares (TryCancel, from any thread).

#include <cstdint>
#include <memory>

#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace estuary::router {

class DecodeStream final : public grpc::ClientReadReactor<estuary::v1::DecodeResponse> {
 public:
  class Owner {
   public:
    virtual ~Owner() = default;
    // A response of call `call` arrived; false reads no more (the owner cancels the call).
    virtual bool OnDecodeResponse(uint64_t call, const estuary::v1::DecodeResponse& response) = 0;
    // Call `call` ended with `status`, after its last OnDecodeResponse.
    virtual void OnDecodeEnd(uint64_t call, const grpc::Status& status) = 0;
  };

  // Starts Decode(`request`) on `channel` under `context` (its deadline set by the caller). The
  // owner is kept alive until OnDecodeEnd has run. Its reactions may run before Start returns
  // (on gRPC's threads, or on this one), so the caller must hold no lock the owner takes.
  static void Start(const std::shared_ptr<grpc::Channel>& channel,
                    std::shared_ptr<grpc::ClientContext> context,
                    estuary::v1::DecodeRequest request, std::shared_ptr<Owner> owner,
                    uint64_t call);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  DecodeStream(std::shared_ptr<grpc::ClientContext> context, estuary::v1::DecodeRequest request,
               std::shared_ptr<Owner> owner, uint64_t call);

  std::unique_ptr<estuary::v1::DecodeWorker::Stub> stub_;
  const std::shared_ptr<grpc::ClientContext> context_;
  const estuary::v1::DecodeRequest request_;
  const std::shared_ptr<Owner> owner_;
  const uint64_t call_;
  estuary::v1::DecodeResponse response_;
};

}  // namespace estuary::router
