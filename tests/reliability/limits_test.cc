// Limits (issue 14, item 6; reliability C4 and C14) against real processes: a burst beyond the
// router's queue cap is refused at once with a retry hint while every admitted request
// completes; streams over --max-concurrent-streams (gRPC) and --http-max-concurrent-requests
// (SSE) are refused, not queued on threads; a thousand idle connections on either door do not
// block a new request, and the HTTP door closes its idle ones; a full worker refuses with
// RESOURCE_EXHAUSTED naming its flag and stays registered; a request over the message limit is
// refused before it is parsed. The figures are printed ("[figure]") for README's table.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
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
#include "httplib.h"
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

// A loopback TCP connection to `port`; -1 when it cannot be made.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Opens `n` TCP connections to `port` that say the HTTP/2 preface and then nothing. Returns
// their descriptors (closed by the caller).
std::vector<int> IdleConnections(int port, int n) {
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  static const unsigned char kEmptySettings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = Connect(port);
    if (fd < 0) break;
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

// `count` once it reaches `want` (streams that have their first token, counted by the calls'
// threads), or its value when `wait` has passed.
int CountWithin(const std::atomic<int>& count, int want, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (count.load() < want && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return count.load();
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

  // 1,000 idle connections on the gRPC client port (the HTTP door's: the next test).
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
  std::atomic<int> streaming{0};
  for (int i = 0; i < 4; ++i) {
    long_streams.emplace_back([&, i] {
      long_results[static_cast<size_t>(i)] =
          t::Generate(cluster.stub(), long_request, nullptr, &streaming);
    });
  }
  // Wait until the router counts four streams: each has had its first token. (A fixed second
  // was not always enough beside other tests on two cores: the fifth call was then admitted.)
  ASSERT_EQ(CountWithin(streaming, 4, absl::Seconds(20)), 4) << cluster.Logs();
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
  // Slots are back as soon as the streams have ended (the router frees a slot as the stream's
  // end goes out, not when gRPC is done with the call afterwards).
  const t::Generated after = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  for (int fd : idle) close(fd);
}

// A stream's admission slot is free by the time its client sees the end: with
// --max-concurrent-streams 1, back-to-back requests from one client are never refused. (The
// router once freed the slot only when gRPC had done with the call, after the client saw the
// end, and the next request could meet RESOURCE_EXHAUSTED.)
TEST(LimitsTest, ASlotIsFreeWhenItsStreamHasEnded) {
  t::Cluster cluster(t::Spec("stories260K", 0, 1, 1, 1, {"--max-concurrent-streams", "1"}));
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  // 200 in a row: without the fix about two runs in five met a refusal within 50.
  for (int i = 0; i < 200; ++i) {
    const t::Generated got = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 2));
    ASSERT_TRUE(got.status.ok()) << "request " << i << ": " << got.status.error_message();
  }
}

// Opens `n` HTTP/1.1 connections to `port` that go quiet in three ways: half say nothing, a
// quarter stop in the middle of a request line (a slow client), a quarter ask GET /live once and
// then keep the connection open without reading the answer (keep-alive).
std::vector<int> IdleHttpConnections(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = Connect(port);
    if (fd < 0) break;
    if (i % 4 == 1) {
      static const char kPartial[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
      (void)!write(fd, kPartial, sizeof(kPartial) - 1);
    } else if (i % 4 == 3) {
      static const char kProbe[] = "GET /live HTTP/1.1\r\nHost: x\r\n\r\n";
      (void)!write(fd, kProbe, sizeof(kProbe) - 1);
    }
    fds.push_back(fd);
  }
  return fds;
}

// How many of `fds` the peer has closed (EOF or reset after whatever it sent), waiting up to
// `wait` in all.
int ClosedByPeer(const std::vector<int>& fds, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  int closed = 0;
  for (int fd : fds) {
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      const int ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      if (poll(&p, 1, ms) <= 0) break;
      char buffer[4096];
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n <= 0) {
        ++closed;
        break;
      }
    }
  }
  return closed;
}

// One SSE request against the HTTP door, read to its end.
struct SseResult {
  int status = 0;  // 0: no answer
  std::string retry_after;
  std::string error_body;
  int events = 0;  // "data:" lines
  bool done = false;
};

SseResult StreamOverHttp(const std::string& address, int max_tokens,
                         std::atomic<int>* first_events = nullptr) {
  httplib::Client client(absl::StrCat("http://", address));
  client.set_read_timeout(std::chrono::seconds(60));
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.headers.emplace("Content-Type", "application/json");
  request.body = absl::StrCat(R"({"prompt":[1,403,407],"temperature":0,"ignore_eos":true,)",
                              R"("stream":true,"max_tokens":)", max_tokens, "}");
  SseResult result;
  std::string body;
  request.response_handler = [&](const httplib::Response& response) {
    result.status = response.status;
    result.retry_after = response.get_header_value("Retry-After");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    if (result.status == 200 && result.events == 0 && Contains(body, "data: ") &&
        first_events != nullptr) {
      first_events->fetch_add(1);
    }
    for (size_t at = body.find("data: "); at != std::string::npos; at = body.find("data: ", at + 1)) {
      if (at == 0 || body[at - 1] == '\n') ++result.events;
    }
    result.done = Contains(body, "data: [DONE]\n\n");
    if (result.status != 200) {
      result.error_body = body;
    } else {
      // Keep only an unfinished tail, so that events are counted once.
      const size_t last = body.rfind("\n\n");
      if (last != std::string::npos && !result.done) body.erase(0, last + 2);
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  if (!client.send(request, response, error)) result.status = 0;
  return result;
}

// C14 on the HTTP door (and beside it the gRPC door again): 1,000 idle HTTP connections and
// 1,000 idle gRPC connections hold no thread, so new requests on both doors are served at once
// (an event loop; cpp-httplib before held a thread per connection, and a thread per connection
// crashed gRPC's chttp2 under the same load); SSE streams over --http-max-concurrent-requests
// are refused with 429 at once, not queued; the door closes idle connections (keep-alive 5 s,
// --http-read-timeout for a request begun and stalled).
TEST(LimitsTest, IdleHttpConnectionsDoNotBlockAndSseStreamsOverTheCapAreRefused) {
  struct rlimit files {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 2100) GTEST_SKIP() << "the hard open-file limit is below 2,000 sockets";

  t::ClusterSpec spec = t::Spec("stories260K", 0, 1, 1, 1,
                                {"--http-port", "0", "--http-max-concurrent-requests", "4",
                                 "--http-read-timeout", "2s"});
  spec.decode_flags = {"--debug-step-delay", "50ms"};
  t::Cluster cluster(spec);
  const std::string http = t::RouterHttpAddress(cluster);
  ASSERT_FALSE(http.empty()) << cluster.Logs();
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);

  const absl::Time opened = absl::Now();
  std::vector<int> idle_http = IdleHttpConnections(PortOf(http), 1000);
  std::vector<int> idle_grpc = IdleConnections(PortOf(cluster.router_address()), 1000);
  ASSERT_EQ(idle_http.size(), 1000u);
  ASSERT_EQ(idle_grpc.size(), 1000u);
  absl::SleepFor(absl::Milliseconds(300));  // every connection accepted and read by now

  // A new HTTP request on a new connection, beside the 2,000 idle ones.
  httplib::Client client(absl::StrCat("http://", http));
  client.set_read_timeout(std::chrono::seconds(30));
  absl::Time start = absl::Now();
  auto models = client.Get("/v1/models");
  const absl::Duration models_took = absl::Now() - start;
  ASSERT_TRUE(models) << httplib::to_string(models.error());
  EXPECT_EQ(models->status, 200);
  start = absl::Now();
  auto completion = client.Post(
      "/v1/completions", R"({"prompt":[1,403,407],"max_tokens":4,"temperature":0,"ignore_eos":true})",
      "application/json");
  const absl::Duration completion_took = absl::Now() - start;
  ASSERT_TRUE(completion) << httplib::to_string(completion.error());
  EXPECT_EQ(completion->status, 200) << completion->body;
  start = absl::Now();
  const t::Generated grpc_got = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4));
  const absl::Duration grpc_took = absl::Now() - start;
  EXPECT_TRUE(grpc_got.status.ok()) << grpc_got.status.error_message();
  std::printf("[figure] C14 beside 1000 idle HTTP + 1000 idle gRPC connections: GET /v1/models "
              "%.1f ms, a 4-token HTTP completion %.1f ms, a 4-token gRPC stream %.1f ms (50 ms "
              "steps)\n",
              absl::ToDoubleMilliseconds(models_took), absl::ToDoubleMilliseconds(completion_took),
              absl::ToDoubleMilliseconds(grpc_took));
  // A thread per connection made this wait for the keep-alive timeout (5 s) per 272 connections
  // ahead of it; an event loop answers in milliseconds. The bounds leave room for a loaded
  // 2-core CI machine (4 engine steps of 50 ms for the completion).
  EXPECT_LT(models_took, absl::Seconds(1));
  EXPECT_LT(completion_took, absl::Seconds(3));

  // Four SSE streams of 40 tokens (2 s) hold every slot; a fifth is refused at once.
  std::atomic<int> streaming{0};
  std::vector<SseResult> streams(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { streams[static_cast<size_t>(i)] = StreamOverHttp(http, 40, &streaming); });
  }
  ASSERT_EQ(CountWithin(streaming, 4, absl::Seconds(20)), 4) << cluster.Logs();
  start = absl::Now();
  const SseResult refused = StreamOverHttp(http, 40);
  const absl::Duration refused_in = absl::Now() - start;
  EXPECT_EQ(refused.status, 429) << refused.error_body;
  EXPECT_EQ(refused.retry_after, "1");
  EXPECT_TRUE(Contains(refused.error_body, "--http-max-concurrent-requests")) << refused.error_body;
  EXPECT_EQ(refused.events, 0);
  EXPECT_LT(refused_in, absl::Seconds(1));
  std::printf("[figure] C14 an SSE stream over --http-max-concurrent-requests 4: 429 in %.2f ms\n",
              absl::ToDoubleMilliseconds(refused_in));
  for (std::thread& thread : threads) thread.join();
  for (const SseResult& s : streams) {
    EXPECT_EQ(s.status, 200);
    EXPECT_TRUE(s.done) << "a stream ended without [DONE]";
    EXPECT_GE(s.events, 2);
  }
  // The slots are back.
  const SseResult after = StreamOverHttp(http, 4);
  EXPECT_EQ(after.status, 200) << after.error_body;
  EXPECT_TRUE(after.done);

  // The door has closed (or closes now) every idle connection: the quiet and keep-alive ones
  // 5 s after their last byte, the stalled requests after --http-read-timeout 2s.
  const int closed = ClosedByPeer(idle_http, opened + absl::Seconds(9) - absl::Now());
  const absl::Duration all_closed_after = absl::Now() - opened;
  EXPECT_EQ(closed, 1000);
  std::printf("[figure] C14 idle HTTP connections closed by the door: %d of 1000, all by %.1f s "
              "after they opened (keep-alive 5 s)\n",
              closed, absl::ToDoubleSeconds(all_closed_after));
  // gRPC's chttp2 still serves beside its own 1,000 idle connections.
  EXPECT_TRUE(t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 4)).status.ok())
      << cluster.Logs();
  for (int fd : idle_http) close(fd);
  for (int fd : idle_grpc) close(fd);
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
