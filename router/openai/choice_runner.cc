#include "router/openai/choice_runner.h"

#include <algorithm>
#include <utility>

#include "rpc/status_convert.h"

namespace estuary::openai {

ChoiceRunner::ChoiceRunner(estuary::v1::Inference::StubInterface& stub,
                           std::vector<estuary::v1::GenerateRequest> choices, absl::Time deadline,
                           int samples_per_prompt) {
  const int n = std::max(samples_per_prompt, 1);
  for (size_t i = 0; i < choices.size(); ++i) {
    first_sample_.push_back(static_cast<int>(i) / n * n);
  }
  {
    absl::MutexLock lock(&mu_);
    running_ = static_cast<int>(choices.size());
    started_ids_.resize(choices.size());
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    contexts_.back()->set_deadline(absl::ToChronoTime(deadline));
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    threads_.emplace_back(&ChoiceRunner::Run, this, static_cast<int>(i), std::ref(stub),
                          std::move(choices[i]));
  }
}

ChoiceRunner::~ChoiceRunner() {
  CancelAll();
  for (std::thread& thread : threads_) thread.join();
}

void ChoiceRunner::CancelAll() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  for (auto& context : contexts_) context->TryCancel();
}

std::optional<std::string> ChoiceRunner::AwaitFirstSample(int first) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, first]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || started_ids_[static_cast<size_t>(first)].has_value();
  };
  mu_.Await(absl::Condition(&ready));
  if (cancelled_) return std::nullopt;
  return *started_ids_[static_cast<size_t>(first)];
}

void ChoiceRunner::FirstSampleStarted(int index, const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  std::optional<std::string>& id = started_ids_[static_cast<size_t>(index)];
  if (!id.has_value()) id = request_id;
}

void ChoiceRunner::Push(ChoiceEvent event) {
  absl::MutexLock lock(&mu_);
  if (event.kind != ChoiceEvent::Kind::kChunk) --running_;
  events_.push_back(std::move(event));
}

void ChoiceRunner::Run(int index, estuary::v1::Inference::StubInterface& stub,
                       estuary::v1::GenerateRequest request) {
  grpc::ClientContext& context = *contexts_[index];
  const int first = first_sample_[static_cast<size_t>(index)];
  if (first != index) {
    std::optional<std::string> beside = AwaitFirstSample(first);
    if (!beside.has_value()) {
      ChoiceEvent cancelled;
      cancelled.index = index;
      cancelled.kind = ChoiceEvent::Kind::kError;
      cancelled.error = absl::CancelledError("the request was cancelled");
      Push(std::move(cancelled));
      return;
    }
    request.set_same_prompt_as(*beside);
  }
  std::unique_ptr<grpc::ClientReaderInterface<estuary::v1::GenerateResponse>> reader =
      stub.Generate(&context, request);
  estuary::v1::GenerateResponse response;
  ChoiceEvent last;  // the Complete, held until Finish says the stream ended well
  last.kind = ChoiceEvent::Kind::kError;
  bool completed = false;
  while (reader->Read(&response)) {
    last.request_id = response.request_id();
    FirstSampleStarted(index, response.request_id());
    if (response.has_chunk() && !completed) {
      ChoiceEvent event;
      event.index = index;
      event.request_id = response.request_id();
      event.chunk = std::move(*response.mutable_chunk());
      Push(std::move(event));
    } else if (response.has_complete() && !completed) {
      completed = true;
      last.kind = ChoiceEvent::Kind::kComplete;
      last.complete = std::move(*response.mutable_complete());
    }
  }
  last.index = index;
  FirstSampleStarted(index, "");  // ended without a response: the others start on their own
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    last.kind = ChoiceEvent::Kind::kError;
    last.error = rpc::FromGrpcStatus(status);
  } else if (!completed) {
    last.error = absl::InternalError("the router ended the stream without a Complete");
  }
  Push(std::move(last));
}

bool ChoiceRunner::Next(ChoiceEvent& event, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !events_.empty() || running_ == 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool ChoiceRunner::finished() {
  absl::MutexLock lock(&mu_);
  return running_ == 0 && events_.empty();
}

}  // namespace estuary::openai
