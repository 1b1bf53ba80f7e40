// Limits (issue 14, item 6; reliability C4 and C14) against real processes: a burst beyond the
// router's queue cap is refused at once with a retry hint while every admitted request
// completes; streams over --max-concurrent-streams are refused, not queued on threads; a
// thousand idle connections do not block a new request; a full worker refuses with
// RESOURCE_EXHAUSTED naming its flag and stays registered; a request over the message limit is
// refused before it is parsed. The figures are printed ("[figure]") for README's table.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/overload.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;

struct Outcome {
  t::Generated got;
  absl::Duration took;
  absl::Duration retry_after;
};

// Starts every request at the same moment (a burst) from its own thread and waits for all.
std::vector<Outcome> Burst(estuary::v1::Inference::Stub& stub,
                           const estuary::v1::GenerateRequest& request, int n) {
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      const absl::Time start = absl::Now();
      Outcome& out = outcomes[static_cast<size_t>(i)];
      out.got = t::Generate(stub, request, &context);
      out.took = absl::Now() - start;
      out.retry_after = rpc::RetryAfter(context);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  go.store(true);
  for (std::thread& c : clients) c.join();
  return outcomes;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[i];
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// C4: a burst of 200 against a queue cap of 32. The decode worker's steps are slowed so that
// requests stay queued (waiting for their first token) long enough for the cap to matter.
TEST(LimitsTest, ABurstBeyondTheQueueCapIsRefusedAtOnceAndEveryAdmittedRequestCompletes) {
  t::ClusterSpec spec = t::Spec("stories260K", 1, 1, 1, 1, {"--max-queued-requests", "32"});
  spec.decode_flags = {"--debug-step-delay", "20ms", "--max-num-seqs", "64"};
  t::Cluster cluster(spec);
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  const estuary::v1::GenerateRequest request = cluster.Greedy(c.prompt_ids, 8);
  const std::vector<int32_t> expected(c.completion_ids.begin(), c.completion_ids.begin() + 8);

  const std::vector<Outcome> outcomes = Burst(cluster.stub(), request, 200);
  int completed = 0;
  std::vector<double> refused_ms;
  for (const Outcome& o : outcomes) {
    if (o.got.status.ok()) {
      ++completed;
      EXPECT_EQ(o.got.ids, expected);
      continue;
    }
    ASSERT_EQ(o.got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << o.got.status.error_message() << "\n" << cluster.Logs();
    EXPECT_TRUE(Contains(o.got.status.error_message(), "--max-queued-requests"))
        << o.got.status.error_message();
    EXPECT_TRUE(o.got.ids.empty());
    EXPECT_EQ(o.retry_after, rpc::kDefaultRetryAfter);
    refused_ms.push_back(absl::ToDoubleMilliseconds(o.took));
  }
  const double p50 = Percentile(refused_ms, 0.5), p99 = Percentile(refused_ms, 0.99);
  std::printf("[figure] C4 burst 200 vs --max-queued-requests 32: %d completed, %zu refused, "
              "refusal latency p50 %.2f ms p99 %.2f ms (client side)\n",
              completed, refused_ms.size(), p50, p99);
  EXPECT_GE(completed, 32);
  EXPECT_GT(refused_ms.size(), 0u) << "the cap never refused: the burst did not queue";
  // The refusal happens before the request is read; 10 ms is the checklist's bound on an idle
  // machine, this bound leaves room for a loaded 2-core CI host (200 client threads).
  EXPECT_LT(p99, 250.0);
  // The router is fine afterwards.
  EXPECT_EQ(t::Generate(cluster.stub(), request).ids, expected);
}

// Opens `n` TCP connections to `port` that say the HTTP/2 preface and then nothing. Returns
// their descriptors (closed by the caller).
std::vector<int> IdleConnections(int port, int n) {
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  static const unsigned char kEmptySettings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      break;
    }
    (void)!write(fd, kPreface, sizeof(kPreface) - 1);
    (void)!write(fd, kEmptySettings, sizeof(kEmptySettings));
    fds.push_back(fd);
  }
  return fds;
}

int PortOf(const std::string& address) {
  const std::vector<std::string> parts = absl::StrSplit(address, ':');
  int port = 0;
  return absl::SimpleAtoi(parts.back(), &port) ? port : 0;
}

// C14: 1,000 idle connections do not block a new request; streams over the cap are refused at
// once (not queued on a thread) and a slot frees when a stream ends.
TEST(LimitsTest, IdleConnectionsDoNotBlockAndStreamsOverTheCapAreRefused) {
  struct rlimit files {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 2100) GTEST_SKIP() << "the hard open-file limit is below 1,000 sockets";

  t::ClusterSpec spec = t::Spec("stories260K", 0, 1, 1, 1, {"--max-concurrent-streams", "4"});
  spec.decode_flags = {"--debug-step-delay", "100ms"};
  t::Cluster cluster(spec);
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);

  // 1,000 idle connections on the gRPC client port. (The HTTP door is not covered: cpp-httplib
  // holds a thread per open connection; README, reliability C14.)
  std::vector<int> idle = IdleConnections(PortOf(cluster.router_address()), 1000);
  ASSERT_EQ(idle.size(), 1000u);
  absl::SleepFor(absl::Milliseconds(500));
  absl::Time start = absl::Now();
  t::Generated got = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4));
  const absl::Duration with_idle = absl::Now() - start;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cluster.Logs();
  std::printf("[figure] C14 a request beside 1000 idle gRPC connections: %.1f ms (4 tokens at a "
              "100 ms step)\n", absl::ToDoubleMilliseconds(with_idle));

  // Four long streams hold every slot; the fifth is refused at once, naming the cap.
  estuary::v1::GenerateRequest long_request = cluster.Greedy(c.prompt_ids, 30);
  long_request.mutable_sampling()->set_ignore_eos(true);  // 30 steps of 100 ms: 3 s
  std::vector<std::thread> long_streams;
  std::vector<t::Generated> long_results(4);
  for (int i = 0; i < 4; ++i) {
    long_streams.emplace_back([&, i] {
      long_results[static_cast<size_t>(i)] = t::Generate(cluster.stub(), long_request);
    });
  }
  // Wait until the router counts four streams: each has its first token by then.
  absl::SleepFor(absl::Seconds(1));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  start = absl::Now();
  got = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4), &context);
  const absl::Duration refused_in = absl::Now() - start;
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  EXPECT_TRUE(Contains(got.status.error_message(), "--max-concurrent-streams"))
      << got.status.error_message();
  EXPECT_EQ(rpc::RetryAfter(context), rpc::kDefaultRetryAfter);
  EXPECT_LT(refused_in, absl::Seconds(1));
  std::printf("[figure] C14 a stream over --max-concurrent-streams 4: refused in %.2f ms\n",
              absl::ToDoubleMilliseconds(refused_in));
  for (std::thread& s : long_streams) s.join();
  for (const t::Generated& r : long_results) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // Slots are back.
  EXPECT_TRUE(t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4)).status.ok());
  for (int fd : idle) close(fd);
}

// A full decode worker refuses with RESOURCE_EXHAUSTED naming its flags and a retry hint; the
// router tries again and then passes the refusal on, and the worker stays registered and
// serves once it has room.
TEST(LimitsTest, AFullWorkerRefusesWithItsFlagAndStaysRegistered) {
  t::ClusterSpec spec = t::Spec("stories260K", 0, 1, 1, 1);
  spec.decode_flags = {"--max-num-seqs", "1", "--max-waiting-requests", "1",
                       "--debug-step-delay", "50ms"};
  t::Cluster cluster(spec);
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  const estuary::v1::GenerateRequest request = cluster.Greedy(c.prompt_ids, 20);

  const std::vector<Outcome> outcomes = Burst(cluster.stub(), request, 8);
  int completed = 0, refused = 0;
  for (const Outcome& o : outcomes) {
    if (o.got.status.ok()) {
      ++completed;
      continue;
    }
    ++refused;
    EXPECT_EQ(o.got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << o.got.status.error_message();
    EXPECT_TRUE(Contains(o.got.status.error_message(), "--max-waiting-requests"))
        << o.got.status.error_message();
    EXPECT_EQ(o.retry_after, rpc::kDefaultRetryAfter);
  }
  std::printf("[figure] 8 at once on a decode worker of 1 + 1 slots: %d completed, %d refused\n",
              completed, refused);
  EXPECT_GE(completed, 2);
  EXPECT_GT(refused, 0);
  // Still registered: the next request is served.
  const t::Generated after = t::Generate(cluster.stub(), request);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message() << "\n" << cluster.Logs();
}

// A request over the router's 4 MiB message limit is refused by gRPC before anything reads it.
TEST(LimitsTest, ARequestOverTheMessageLimitIsRefusedBeforeItIsRead) {
  t::Cluster cluster(t::Spec("stories260K", 0, 1, 1, 1));
  estuary::v1::GenerateRequest request;
  request.set_text(std::string(5 << 20, 'a'));
  request.mutable_sampling()->set_max_tokens(1);
  const t::Generated got = t::Generate(cluster.stub(), request);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  // And the router serves the next one.
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  EXPECT_TRUE(t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4)).status.ok());
}

}  // namespace
}  // namespace estuary
