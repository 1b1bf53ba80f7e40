#include "router/decode_stream.h"

#include <utility>

namespace estuary::router {

DecodeStream::DecodeStream(std::shared_ptr<grpc::ClientContext> context,
                           estuary::v1::DecodeRequest request, std::shared_ptr<Owner> owner,
                           uint64_t call)
    : context_(std::move(context)),
      request_(std::move(request)),
      owner_(std::move(owner)),
      call_(call) {}

void DecodeStream::Start(const std::shared_ptr<grpc::Channel>& channel,
                         std::shared_ptr<grpc::ClientContext> context,
                         estuary::v1::DecodeRequest request, std::shared_ptr<Owner> owner,
                         uint64_t call) {
  // Deleted in OnDone, which gRPC calls exactly once, after every other reaction.
  auto* stream = new DecodeStream(std::move(context), std::move(request), std::move(owner), call);
  stream->stub_ = estuary::v1::DecodeWorker::NewStub(channel);
  stream->stub_->async()->Decode(stream->context_.get(), &stream->request_, stream);
  stream->StartRead(&stream->response_);
  stream->StartCall();
}

void DecodeStream::OnReadDone(bool ok) {
  // Reads go one after another from inside this reaction, so no hold is needed: once a read
  // fails (the stream ended) or the owner wants no more, OnDone follows the end status.
  if (ok && owner_->OnDecodeResponse(call_, response_)) StartRead(&response_);
}

void DecodeStream::OnDone(const grpc::Status& status) {
  owner_->OnDecodeEnd(call_, status);
  delete this;
}

}  // namespace estuary::router
