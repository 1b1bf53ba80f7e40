// The cluster across network hosts (issue: cluster-ready processes). Every process runs on its
// own "node", a Linux network namespace with one address (tests/multinode/network_hosts.h):
// routers on two nodes, a TP 2 prefill worker and TP 1 decode workers on others, KV over UCX
// tcp between nodes. Workers bind 0.0.0.0 and advertise the address of their default-route
// interface; router1 learns them by registration, router2 by name (--discover-workers, over
// the nodes' hosts file, as a headless Service's A records), so both serve the same workers.
//
// Every process has the cluster token, as a deployment's do: internal ports want it, and KV
// transfer descriptors go sealed from node to node (kvtransfer/descriptor_seal.h).
//
// Skips, saying why, where namespaces cannot be made (not root, no `ip`, no netns support).
// Nothing is left behind: NetworkHosts removes its namespaces and links, and kills whatever
// still runs in them.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/multinode/network_hosts.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/health_check.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

using ::estuary::testing::BinaryPath;
using ::estuary::testing::Generate;
using ::estuary::testing::Generated;
using ::estuary::testing::GoldenCase;
using ::estuary::testing::GoldenModelDir;
using ::estuary::testing::GreedyIds;
using ::estuary::testing::NetworkHosts;
using ::estuary::testing::TempPath;

constexpr int kRouterPort = 50051;
constexpr int kWorkerPort = 50060;
// A stream to a node whose cable is pulled ends within the router's keepalive (1 s ping, 2 s
// timeout: rpc/channels.h) plus a relay and scheduling margin.
constexpr absl::Duration kLinkDownBound = absl::Seconds(8);

constexpr char kClusterToken[] = "multinode-cluster-token-0123456789";

struct NodeClusterSpec {
  std::string model = "stories260K";
  int decode = 1;
  int tp_prefill = 2;
  std::vector<std::string> decode_flags;  // extra flags of every decode worker
};

// Routers, a prefill worker and decode workers, each on its own node.
class NodeCluster {
 public:
  static std::vector<std::string> NodeNames(int decode) {
    std::vector<std::string> nodes = {"router1", "router2", "prefill"};
    for (int i = 1; i <= decode; ++i) nodes.push_back(absl::StrCat("decode", i));
    return nodes;
  }

  // Makes the nodes; a skip reason when namespaces cannot be made here.
  absl::Status Build(const NodeClusterSpec& spec) {
    spec_ = spec;
    absl::StatusOr<std::unique_ptr<NetworkHosts>> hosts = NetworkHosts::Create(NodeNames(spec.decode));
    if (!hosts.ok()) return hosts.status();
    hosts_ = std::move(*hosts);
    std::vector<std::string> decode_addresses;
    for (int i = 1; i <= spec.decode; ++i) decode_addresses.push_back(Address(DecodeNode(i)));
    std::vector<std::pair<std::string, std::vector<std::string>>> names = {
        {"decode-workers", decode_addresses}, {"prefill-workers", {Address("prefill")}}};
    for (const std::string& node : hosts_->nodes()) names.push_back({node, {Address(node)}});
    return hosts_->SetHosts(names);
  }

  void Start() {
    // router1: workers register with it by name; router2 finds them by name.
    routers_["router1"] = StartOn("router1", "router/estuary-router", RouterFlags({}));
    routers_["router2"] = StartOn(
        "router2", "router/estuary-router",
        RouterFlags({"--discover-workers",
                     absl::StrCat("decode-workers:", kWorkerPort, ",prefill-workers:",
                                  kWorkerPort)}));
    prefill_ = StartWorkerOn("prefill");
    for (int i = 1; i <= spec_.decode; ++i) decode_[i] = StartWorkerOn(DecodeNode(i));
    for (const char* router : {"router1", "router2"}) {
      stubs_[router] = estuary::v1::Inference::NewStub(grpc::CreateChannel(
          RouterAddress(router), grpc::InsecureChannelCredentials()));
      WaitForWorkers(router);
    }
  }

  // Starts decode worker i on its node again (after it exited) and waits until both routers
  // place work there... as far as a client can tell: until it serves and a round of discovery
  // and a heartbeat have passed.
  void RestartDecode(int i) {
    decode_[i] = StartWorkerOn(DecodeNode(i));
    const absl::StatusOr<absl::Duration> ready = testing::WaitForHealth(
        decode_[i].address, "", testing::kServing, absl::Seconds(20));
    EXPECT_TRUE(ready.ok()) << ready.status();
    absl::SleepFor(absl::Seconds(1));  // > one heartbeat and one discovery interval (500 ms)
  }

  estuary::v1::Inference::Stub& stub(const std::string& router) { return *stubs_.at(router); }
  ServingProcess& decode(int i) { return decode_.at(i); }
  NetworkHosts& hosts() { return *hosts_; }
  static std::string DecodeNode(int i) { return absl::StrCat("decode", i); }
  std::string Address(const std::string& node) const { return hosts_->address(node); }
  std::string RouterAddress(const std::string& router) const {
    return absl::StrCat(Address(router), ":", kRouterPort);
  }
  int context() const { return context_; }

  std::string Logs() {
    std::string all;
    auto add = [&](const std::string& name, ServingProcess& p) {
      if (p.process != nullptr) absl::StrAppend(&all, "--- ", name, ":\n", p.process->Log(), "\n");
    };
    for (auto& [name, router] : routers_) add(name, router);
    add("prefill", prefill_);
    for (auto& [i, decode] : decode_) add(DecodeNode(i), decode);
    return all;
  }

 private:
  std::vector<std::string> RouterFlags(std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--model", GoldenModelDir(spec_.model), "--host", "0.0.0.0",
                                      "--port", std::to_string(kRouterPort),
                                      "--cluster-token", kClusterToken};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  ServingProcess StartWorkerOn(const std::string& node) {
    const bool decode = node != "prefill";
    std::vector<std::string> flags = {
        "--model", GoldenModelDir(spec_.model), "--host", "0.0.0.0",
        "--port", std::to_string(kWorkerPort), "--router", absl::StrCat("router1:", kRouterPort),
        "--ucx-tls", "tcp", "--kv-cache-bytes", "33554432",
        "--tensor-parallel-size", decode ? "1" : std::to_string(spec_.tp_prefill),
        "--shutdown-timeout", "30s", "--cluster-token", kClusterToken};
    if (decode) flags.insert(flags.end(), spec_.decode_flags.begin(), spec_.decode_flags.end());
    ServingProcess process =
        StartOn(node, decode ? "decode/estuary-decode" : "prefill/estuary-prefill", flags);
    // Bound to 0.0.0.0 without --advertise-address: the address of the node's default-route
    // interface is what the worker registers (its ready file says it too).
    EXPECT_EQ(process.address, absl::StrCat(Address(node), ":", kWorkerPort));
    return process;
  }

  ServingProcess StartOn(const std::string& node, const std::string& binary,
                         const std::vector<std::string>& flags) {
    absl::StatusOr<ServingProcess> started =
        StartServing(BinaryPath(binary), flags, TempPath(absl::StrCat(node, "-", ++starts_)),
                     absl::Seconds(60), hosts_->Command(node, {}));
    EXPECT_TRUE(started.ok()) << node << ": " << started.status();
    return started.ok() ? std::move(*started) : ServingProcess();
  }

  void WaitForWorkers(const std::string& router) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      estuary::v1::ModelInfo info;
      if (stubs_[router]->GetModelInfo(&context, {}, &info).ok() && info.decode_tp_size() > 0 &&
          info.prefill_tp_size() > 0) {
        context_ = info.context_length();
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << router << " did not learn the workers:\n" << Logs();
  }

  NodeClusterSpec spec_;
  std::unique_ptr<NetworkHosts> hosts_;
  std::map<std::string, ServingProcess> routers_;
  ServingProcess prefill_;
  std::map<int, ServingProcess> decode_;
  std::map<std::string, std::unique_ptr<estuary::v1::Inference::Stub>> stubs_;
  int context_ = 0;
  int starts_ = 0;
};

// Builds and starts a cluster, or skips the test with the reason.
#define START_CLUSTER_OR_SKIP(cluster, spec)                             \
  do {                                                                  \
    if (absl::Status built = (cluster).Build(spec); !built.ok()) {      \
      if (built.code() == absl::StatusCode::kFailedPrecondition) {      \
        GTEST_SKIP() << "no network namespaces here: " << built;        \
      }                                                                 \
      FAIL() << built;                                                  \
    }                                                                   \
    (cluster).Start();                                                  \
    if (HasFailure()) return;                                           \
  } while (0)

estuary::v1::GenerateRequest Steady(int max_tokens) {
  estuary::v1::GenerateRequest request = GreedyIds({1, 403, 407, 261}, max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

class MultiNodeGoldenTest : public ::testing::TestWithParam<std::string> {};

// Every golden case of the model, through both routers: TP 2 prefill on one node, TP 1 decode
// on another, KV over UCX tcp between them.
TEST_P(MultiNodeGoldenTest, GoldenIdsAcrossNodesThroughBothRouters) {
  NodeCluster cluster;
  NodeClusterSpec spec;
  spec.model = GetParam();
  START_CLUSTER_OR_SKIP(cluster, spec);
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases(spec.model);
  ASSERT_FALSE(cases.empty());
  for (const GoldenCase& c : cases) {
    const int max_tokens = ::estuary::testing::FittingMaxTokens(c.prompt_ids, cluster.context());
    for (const char* router : {"router1", "router2"}) {
      const Generated got = Generate(cluster.stub(router), GreedyIds(c.prompt_ids, max_tokens));
      ASSERT_TRUE(got.status.ok()) << router << ": " << got.status.error_message() << "\n"
                                   << cluster.Logs();
      EXPECT_EQ(got.ids, c.completion_ids) << router << " case " << c.index;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MultiNodeGoldenTest,
                         ::testing::ValuesIn(::estuary::testing::GoldenModels()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Clients that send requests to both routers in turn until stopped, counting what fails.
class SteadyLoad {
 public:
  SteadyLoad(NodeCluster& cluster, int clients, int max_tokens) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, &cluster, c, max_tokens] {
        for (int n = 0; !stop_.load(); ++n) {
          const char* router = (c + n) % 2 == 0 ? "router1" : "router2";
          const Generated got = Generate(cluster.stub(router), Steady(max_tokens));
          absl::MutexLock lock(&mu_);
          if (got.status.ok() && static_cast<int>(got.ids.size()) == max_tokens) {
            ++completed_;
          } else {
            failures_.push_back(absl::StrCat(router, ": ", got.status.error_code(), " ",
                                             got.status.error_message(), " (", got.ids.size(),
                                             " tokens)"));
          }
        }
      });
    }
  }
  // Stops the clients after their current requests; the failures.
  std::vector<std::string> Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    absl::MutexLock lock(&mu_);
    return failures_;
  }
  int completed() {
    absl::MutexLock lock(&mu_);
    return completed_;
  }
  ~SteadyLoad() { (void)Stop(); }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int completed_ = 0;
  std::vector<std::string> failures_;
};

// A rolling restart of the two decode workers (SIGTERM, wait for the exit, start again) under
// a steady load through both routers: every request completes.
TEST(MultiNodeTest, RollingRestartOfDecodeWorkersLosesNoRequest) {
  NodeCluster cluster;
  NodeClusterSpec spec;
  spec.decode = 2;
  spec.decode_flags = {"--debug-step-delay", "10ms"};  // requests overlap the restarts
  START_CLUSTER_OR_SKIP(cluster, spec);
  SteadyLoad load(cluster, /*clients=*/4, /*max_tokens=*/24);
  absl::SleepFor(absl::Seconds(2));
  for (int i = 1; i <= 2; ++i) {
    const int before = load.completed();
    cluster.decode(i).process->Signal(SIGTERM);
    absl::StatusOr<int> exited = cluster.decode(i).process->Wait(absl::Seconds(40));
    ASSERT_TRUE(exited.ok()) << exited.status() << "\n" << cluster.Logs();
    EXPECT_EQ(*exited, 0) << cluster.decode(i).process->Log();
    cluster.RestartDecode(i);
    absl::SleepFor(absl::Seconds(2));
    EXPECT_GT(load.completed(), before) << "the load went on through decode worker " << i;
  }
  const std::vector<std::string> failures = load.Stop();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front()
                                << "\n" << cluster.Logs();
  EXPECT_GT(load.completed(), 20);
  std::printf("rolling restart: %d requests completed, %zu failed\n", load.completed(),
              failures.size());
}

// A node whose cable is pulled mid-stream: its streams resume on the other decode node
// (migration) once the router notices, within kLinkDownBound, and complete with every token;
// the others complete untouched; new requests avoid the node once it is detected.
TEST(MultiNodeTest, ALinkDownMovesThatNodesStreamsToTheOther) {
  NodeCluster cluster;
  NodeClusterSpec spec;
  spec.decode = 2;
  spec.decode_flags = {"--debug-step-delay", "40ms"};  // 100 tokens: about 4 s a stream
  START_CLUSTER_OR_SKIP(cluster, spec);
  constexpr int kStreams = 4, kTokens = 100;
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<estuary::v1::GenerateResponse>> reader;
    std::vector<int32_t> ids;
    absl::Time last_chunk;
    absl::Duration longest_gap;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (int s = 0; s < kStreams; ++s) {
    auto stream = std::make_unique<Stream>();
    stream->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stream->reader = cluster.stub("router1").Generate(&stream->context, Steady(kTokens));
    streams.push_back(std::move(stream));
  }
  auto read = [](Stream& stream, bool first_only) {
    estuary::v1::GenerateResponse response;
    while ((!first_only || stream.ids.empty()) && stream.reader->Read(&response)) {
      if (!response.has_chunk() || response.chunk().token_ids_size() == 0) continue;
      const absl::Time now = absl::Now();
      if (!stream.ids.empty()) {
        stream.longest_gap = std::max(stream.longest_gap, now - stream.last_chunk);
      }
      stream.last_chunk = now;
      stream.ids.insert(stream.ids.end(), response.chunk().token_ids().begin(),
                        response.chunk().token_ids().end());
    }
  };
  // Every stream is under way (least-loaded placement spreads them over both decode nodes).
  for (auto& stream : streams) read(*stream, /*first_only=*/true);
  ASSERT_TRUE(cluster.hosts().SetLinkUp("decode2", false).ok());
  std::vector<std::thread> readers;
  std::vector<grpc::Status> ended(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    readers.emplace_back([&, s] {
      read(*streams[s], /*first_only=*/false);
      ended[s] = streams[s]->reader->Finish();
    });
  }
  for (std::thread& t : readers) t.join();
  int moved = 0;
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(ended[s].ok()) << ended[s].error_message() << "\n" << cluster.Logs();
    EXPECT_EQ(streams[s]->ids, streams[0]->ids) << "the same greedy prompt, the same tokens";
    EXPECT_EQ(static_cast<int>(streams[s]->ids.size()), kTokens);
    EXPECT_LT(streams[s]->longest_gap, kLinkDownBound);
    if (streams[s]->longest_gap > absl::Seconds(1)) {
      ++moved;
      std::printf("stream %d resumed on the other node after a gap of %s\n", s,
                  absl::FormatDuration(streams[s]->longest_gap).c_str());
    }
  }
  EXPECT_GT(moved, 0) << "no stream was on the node whose link went down\n" << cluster.Logs();
  EXPECT_LT(moved, kStreams) << "the other node's streams must run on untouched";
  // Detected: new requests go to the node that is still there, through either router.
  for (int n = 0; n < 6; ++n) {
    const char* router = n % 2 == 0 ? "router1" : "router2";
    const Generated got = Generate(cluster.stub(router), Steady(8));
    EXPECT_TRUE(got.status.ok()) << router << ": " << got.status.error_message();
  }
  EXPECT_TRUE(cluster.hosts().SetLinkUp("decode2", true).ok());
}

}  // namespace
}  // namespace estuary
