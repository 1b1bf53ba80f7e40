#pragma once
// ChoiceRunner: runs the choices of one OpenAI request (prompts x n) on the router's
// estuary.v1.Inference service at once, one Generate stream and one thread each, and hands
// their events to the HTTP thread in arrival order. The HTTP thread owns the runner; the
// destructor cancels whatever still runs (the router then aborts it on both workers) and joins.

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace estuary::openai {

struct ChoiceEvent {
  enum class Kind { kChunk, kComplete, kError };
  int index = 0;  // the choice
  Kind kind = Kind::kChunk;
  estuary::v1::Chunk chunk;        // kChunk
  estuary::v1::Complete complete;  // kComplete: the choice's last event
  std::string request_id;          // the router's id of the choice's request
  absl::Status error;              // kError: the choice's last event
};

class ChoiceRunner {
 public:
  // Starts every choice with `deadline` (absolute) on its call.
  ChoiceRunner(estuary::v1::Inference::StubInterface& stub,
               std::vector<estuary::v1::GenerateRequest> choices, absl::Time deadline);
  ~ChoiceRunner();
  ChoiceRunner(const ChoiceRunner&) = delete;
  ChoiceRunner& operator=(const ChoiceRunner&) = delete;

  // Waits up to `wait` for the next event. Returns false on timeout or when every choice has
  // ended and its events were taken (then finished() is true).
  bool Next(ChoiceEvent& event, absl::Duration wait);
  bool finished();
  // Cancels every call still running (the client went away, or one choice failed).
  void CancelAll();

 private:
  void Run(int index, estuary::v1::Inference::StubInterface& stub,
           estuary::v1::GenerateRequest request);
  void Push(ChoiceEvent event);

  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<ChoiceEvent> events_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace estuary::openai
