#pragma once
// ChoiceRunner: runs the choices of one OpenAI request (prompts x n) on the router's
// estuary.v1.Inference service, one Generate stream and one thread each, and hands their events
// to the HTTP thread in arrival order. The n samples of a prompt share its KV pages: the first
// sample starts at once; the others start when its first token came (its prompt's KV is then on
// its decode worker) and ask to run beside it (GenerateRequest.same_prompt_as). The HTTP thread
// owns the runner; the destructor cancels whatever still runs (the router then aborts it on
// both workers) and joins.

#include <deque>
#include <memory>
#include <optional>
#include <string>
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
  // Starts every choice with `deadline` (absolute) on its call; `samples_per_prompt` (n)
  // consecutive choices are samples of one prompt.
  ChoiceRunner(estuary::v1::Inference::StubInterface& stub,
               std::vector<estuary::v1::GenerateRequest> choices, absl::Time deadline,
               int samples_per_prompt = 1);
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
  // A later sample waits for its prompt's first sample to have a token (or to end); returns the
  // router's id of that request ("" when it ended without one), or nullopt when cancelled.
  std::optional<std::string> AwaitFirstSample(int first);
  void FirstSampleStarted(int index, const std::string& request_id);

  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::thread> threads_;
  std::vector<int> first_sample_;  // per choice: the choice that is its prompt's first sample
  absl::Mutex mu_;
  std::deque<ChoiceEvent> events_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Per choice: set once its first response (or its end) came; the router's request id.
  std::vector<std::optional<std::string>> started_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary::openai
