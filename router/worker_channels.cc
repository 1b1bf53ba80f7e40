#include "router/worker_channels.h"

#include <utility>

#include "estuary/v1/worker.grpc.pb.h"
#include "rpc/channels.h"

namespace estuary::router {

std::shared_ptr<grpc::Channel> WorkerChannels::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) channel = rpc::CreateClusterChannel(address);
  return channel;
}

namespace {

// One Abort in flight: what the callback needs alive until it runs.
struct AbortCall {
  grpc::ClientContext context;
  estuary::v1::WorkerAbortRequest request;
  estuary::v1::WorkerAbortResponse response;
  std::unique_ptr<estuary::v1::DecodeWorker::Stub> decode;
  std::unique_ptr<estuary::v1::PrefillWorker::Stub> prefill;
};

}  // namespace

void SendWorkerAbort(std::shared_ptr<grpc::Channel> channel, estuary::v1::WorkerRole role,
                     const std::string& request_id, absl::Duration timeout) {
  auto call = std::make_shared<AbortCall>();
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  call->request.set_request_id(request_id);
  auto done = [call](const grpc::Status&) {};  // keeps the call alive until the answer
  if (role == estuary::v1::WORKER_ROLE_PREFILL) {
    call->prefill = estuary::v1::PrefillWorker::NewStub(channel);
    call->prefill->async()->Abort(&call->context, &call->request, &call->response, done);
  } else {
    call->decode = estuary::v1::DecodeWorker::NewStub(channel);
    call->decode->async()->Abort(&call->context, &call->request, &call->response, done);
  }
}

}  // namespace estuary::router
