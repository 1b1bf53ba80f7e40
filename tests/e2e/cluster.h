#pragma once
// A whole cluster on loopback for end-to-end tests: a real estuary-router and estuary-prefill /
// estuary-decode processes with the tiny real models, called through the public
// estuary.v1.Inference API. Shared by cluster_test (CPU) and gpu_cluster_test (workers on GPUs).

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace estuary::testing {

// A path in the temp folder unique to this test process.
std::string TempPath(const std::string& name);

// A TCP port free right now on 127.0.0.1 (for a process's --http-port or --metrics-port,
// bound a moment later; another process may take it first: LoggedAddress is race-free).
int FreePort();

// The host:port a process logged right after `marker` (e.g. "OpenAI HTTP on http://"), for
// ports it picked itself (flag value 0); empty when its log has no such line.
std::string LoggedAddress(const ServingProcess& process, const std::string& marker);

// Starts `binary` (relative to the build folder, BinaryPath) with --port 0 and `flags`, waiting
// up to a minute for it to serve. Fails the test (and returns an empty process) otherwise.
ServingProcess StartWorker(const std::string& binary, const std::string& name,
                           std::vector<std::string> flags);

// The golden runs generated 200 tokens or up to the context (256 for stories12L); the router,
// like vLLM, refuses a max_tokens that does not fit, so the tests ask for what fits.
int FittingMaxTokens(const std::vector<int32_t>& prompt, int context, int wanted = 200);

estuary::v1::GenerateRequest GreedyIds(const std::vector<int32_t>& prompt, int max_tokens);

struct ClusterSpec {
  std::string model = "stories12L";
  int prefill = 1, decode = 1, tp_prefill = 1, tp_decode = 1;
  std::vector<std::string> router_flags;
  // The router's --api-key (empty: none); the harness's own calls send it.
  std::string api_key;
  // --cluster-token of the router and every worker (empty: none): internal ports then want it
  // (FreePages's `cluster_token`), and KV transfer descriptors are sealed.
  std::string cluster_token;
  // Extra flags of every prefill / decode worker (e.g. --device cuda --kv-transport nccl).
  std::vector<std::string> prefill_flags;
  std::vector<std::string> decode_flags;
};
void PrintTo(const ClusterSpec& s, std::ostream* os);
// A CPU cluster: `prefill` and `decode` workers of those TP sizes.
ClusterSpec Spec(const std::string& model, int prefill, int decode, int tp_prefill, int tp_decode,
                 std::vector<std::string> router_flags = {});

// A router and its workers; the destructor kills what is left.
class Cluster {
 public:
  explicit Cluster(const ClusterSpec& spec);

  estuary::v1::Inference::Stub& stub() { return *stub_; }
  const std::string& router_address() const { return router_.address; }
  const ServingProcess& router() const { return router_; }
  // A greedy request for `prompt` with as many new tokens as the golden runs had.
  estuary::v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int wanted = 200) const {
    return GreedyIds(prompt, FittingMaxTokens(prompt, context_, wanted));
  }
  ServingProcess& decode(int i) { return workers_[static_cast<size_t>(i)]; }
  ServingProcess& prefill(int i) { return workers_[static_cast<size_t>(spec_.decode + i)]; }
  // Starts decode worker `i` again with the flags it had (a rolling restart: the old process
  // has exited), and waits until it has registered with the router (a minute at most).
  ServingProcess& RestartDecode(int i);
  std::string Logs();

 private:
  void WaitUntilRegistered();
  std::vector<std::string> WorkerFlags(bool decode) const;

  ClusterSpec spec_;
  ServingProcess router_;
  std::vector<ServingProcess> workers_;
  std::unique_ptr<estuary::v1::Inference::Stub> stub_;
  int context_ = 0;
};

// The router's OpenAI HTTP address (host:port, from its log) when it was started with
// --http-port 0 (race-free, unlike a FreePort picked beforehand); "" when it logged none.
std::string RouterHttpAddress(const Cluster& cluster);

struct Generated {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::vector<estuary::v1::TokenLogprobs> logprobs;  // per token, when the request asked
  std::string text;
  estuary::v1::Complete complete;
};

// A worker's free KV pages (its GetLoad, sending `cluster_token` when not empty); -1 when it
// does not answer.
int FreePages(const std::string& address, bool decode, const std::string& cluster_token = "");

// Streams one Generate call to the end (a minute's deadline unless `context` brings one). When
// `streaming` is given it is incremented once the first token chunk arrives (the router then
// counts the call among its streams), so a test can wait for streams to be running.
Generated Generate(estuary::v1::Inference::Stub& stub, const estuary::v1::GenerateRequest& request,
                   grpc::ClientContext* context = nullptr, std::atomic<int>* streaming = nullptr);

}  // namespace estuary::testing
