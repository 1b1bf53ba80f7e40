// Workers that die, hang or restart under running streams (reliability C5, C6, C9; issue 14
// items 1 and 3), against real processes on stories260K:
//   - C5: SIGKILL of a decode worker with 32 streams: each stream resumes on the other decode
//     worker (migration) and the client receives exactly the tokens of an uninterrupted run,
//     greedy and seeded sampling alike, none lost or repeated, usage counted once; with
//     --migration-limit 0 they end UNAVAILABLE saying so, and the rest carry on;
//   - a hung (SIGSTOPped) decode worker: its streams resume elsewhere once --token-gap-timeout
//     passes, long before the channel's keepalive would notice; a call without a deadline still
//     ends at its stages' timeouts;
//   - C6: SIGKILL of a prefill worker mid-prefill: the request is retried on the other one and
//     completes, and the decode worker's reservation is freed;
//   - C9: a rolling restart (SIGTERM, restart) of both decode workers under load: no client sees
//     an error, and every answer is the golden one.
// Figures are printed ("[figure]") for README's table.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;
using estuary::v1::GenerateRequest;
using estuary::v1::GenerateResponse;

constexpr int kTokens = 120;  // per stream

// One Generate stream read chunk by chunk, with the time each chunk came.
struct Stream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<GenerateResponse>> reader;
  std::vector<int32_t> ids;
  std::vector<estuary::v1::TokenLogprobs> logprobs;
  std::vector<absl::Time> chunk_times;
  estuary::v1::Complete complete;
  grpc::Status status;
  absl::Time ended;

  void Start(estuary::v1::Inference::Stub& stub, const GenerateRequest& request) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    reader = stub.Generate(&context, request);
  }
  // Reads one response; false at the end of the stream.
  bool ReadOne() {
    GenerateResponse response;
    if (!reader->Read(&response)) return false;
    if (response.has_chunk()) {
      ids.insert(ids.end(), response.chunk().token_ids().begin(),
                 response.chunk().token_ids().end());
      logprobs.insert(logprobs.end(), response.chunk().logprobs().begin(),
                      response.chunk().logprobs().end());
      chunk_times.push_back(absl::Now());
    } else if (response.has_complete()) {
      complete = response.complete();
    }
    return true;
  }
  bool ReadFirstTokens() {
    while (ids.empty()) {
      if (!ReadOne()) return false;
    }
    return true;
  }
  void ReadToEnd() {
    while (ReadOne()) {
    }
    status = reader->Finish();
    ended = absl::Now();
  }
  // The longest gap between chunks after `from`.
  absl::Duration LongestGapAfter(absl::Time from) const {
    absl::Duration longest;
    for (size_t i = 1; i < chunk_times.size(); ++i) {
      if (chunk_times[i] > from) longest = std::max(longest, chunk_times[i] - chunk_times[i - 1]);
    }
    return longest;
  }
};

GenerateRequest Sampled(const std::vector<int32_t>& prompt, uint64_t seed, bool logprobs) {
  GenerateRequest request = t::GreedyIds(prompt, kTokens);
  estuary::v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(0.8f);
  s->set_top_p(0.95f);
  s->set_presence_penalty(0.3f);
  s->set_frequency_penalty(0.2f);
  s->set_min_tokens(30);
  s->set_ignore_eos(true);
  s->set_seed(seed);
  if (logprobs) s->set_logprobs(2);
  return request;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& ids, size_t n) {
  return std::vector<int32_t>(ids.begin(),
                              ids.begin() + static_cast<long>(std::min(n, ids.size())));
}

// Lines of `log` that contain `needle` (and `also`, when given).
int Count(const std::string& log, const std::string& needle, const std::string& also = "") {
  int n = 0;
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, needle) && absl::StrContains(line, also)) ++n;
  }
  return n;
}

// Until `worker` logged its registration (a minute at most).
void WaitRegistered(const ServingProcess& worker) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline &&
         worker.process->Log().find("registered with the router") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Starts `requests` one after another, each once its predecessor has its first tokens, so that
// round-robin placement alternates the decode workers strictly.
std::vector<std::unique_ptr<Stream>> StartInTurn(t::Cluster& cluster,
                                                 const std::vector<GenerateRequest>& requests) {
  std::vector<std::unique_ptr<Stream>> streams;
  for (const GenerateRequest& request : requests) {
    streams.push_back(std::make_unique<Stream>());
    streams.back()->Start(cluster.stub(), request);
    EXPECT_TRUE(streams.back()->ReadFirstTokens()) << cluster.Logs();
  }
  return streams;
}

// The first of workers 0 and 1 for which `holds` is true, polled for up to 10 s; -1 if neither.
int FirstOfTwoThat(const std::function<bool(int)>& holds) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    for (int i = 0; i < 2; ++i) {
      if (holds(i)) return i;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

void ReadAllToEnd(std::vector<std::unique_ptr<Stream>>& streams) {
  std::vector<std::thread> readers;
  for (auto& stream : streams) readers.emplace_back([&stream] { stream->ReadToEnd(); });
  for (std::thread& reader : readers) reader.join();
}

// C5: 32 streams (24 greedy, then 8 seeded samples, half of those with logprobs) over two
// decode workers, one SIGKILLed once every stream runs: every stream completes with the tokens
// of an uninterrupted run and usage counting each once. Each stream carries its own request id,
// so the router's log says which ones were resumed: greedy and sampled streams both.
TEST(MigrationTest, AKilledDecodeWorkersStreamsResumeElsewhereTokenForToken) {
  t::ClusterSpec spec = t::Spec("stories260K", 1, 2, 1, 1, {"--policy", "round_robin"});
  spec.decode_flags = {"--debug-step-delay", "15ms"};  // 120 tokens: about 2 s a stream
  t::Cluster cluster(spec);
  WaitRegistered(cluster.decode(1));
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  ASSERT_FALSE(cases.empty());
  constexpr int kGreedy = 24, kSampled = 8;
  std::vector<GenerateRequest> sampled;
  for (int i = 0; i < kSampled; ++i) {
    sampled.push_back(Sampled(cases[static_cast<size_t>(i) % cases.size()].prompt_ids,
                              1000 + static_cast<uint64_t>(i), /*logprobs=*/i % 2 == 0));
  }
  // The seeded samples' uninterrupted run, as a reference.
  std::vector<std::unique_ptr<Stream>> reference = StartInTurn(cluster, sampled);
  ReadAllToEnd(reference);
  for (int i = 0; i < kSampled; ++i) {
    ASSERT_TRUE(reference[i]->status.ok()) << reference[i]->status.error_message();
    ASSERT_EQ(reference[i]->ids.size(), static_cast<size_t>(kTokens));
  }
  // Greedy first; the samples last, so that they surely still run when the worker dies.
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < kGreedy; ++i) {
    const t::GoldenCase& c = cases[static_cast<size_t>(i) % cases.size()];
    requests.push_back(t::GreedyIds(c.prompt_ids, kTokens));
    requests.back().set_request_id(absl::StrCat("greedy-", i));
    expected.push_back(Prefix(c.completion_ids, kTokens));
  }
  for (int i = 0; i < kSampled; ++i) {
    requests.push_back(sampled[static_cast<size_t>(i)]);
    requests.back().set_request_id(absl::StrCat("sampled-", i));
    expected.push_back(reference[static_cast<size_t>(i)]->ids);
  }

  std::vector<std::unique_ptr<Stream>> streams = StartInTurn(cluster, requests);
  cluster.decode(0).process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ReadAllToEnd(streams);

  absl::Duration longest_gap;
  for (int i = 0; i < kGreedy + kSampled; ++i) {
    const Stream& s = *streams[static_cast<size_t>(i)];
    ASSERT_TRUE(s.status.ok()) << "stream " << i << ": " << s.status.error_message() << "\n"
                               << cluster.router().process->Log();
    EXPECT_EQ(s.ids, expected[static_cast<size_t>(i)]) << "stream " << i;
    EXPECT_EQ(s.complete.usage().completion_tokens(), static_cast<int>(s.ids.size()));
    EXPECT_EQ(s.complete.finish_reason(), estuary::v1::FINISH_REASON_LENGTH);
    const int sample = i - kGreedy;
    if (sample >= 0 && sample % 2 == 0) {
      ASSERT_EQ(s.logprobs.size(), s.ids.size()) << "stream " << i;
      const auto& want = reference[static_cast<size_t>(sample)]->logprobs;
      for (size_t k = 0; k < s.logprobs.size(); ++k) {
        EXPECT_NEAR(s.logprobs[k].logprob(), want[k].logprob(), 1e-3)
            << "stream " << i << " token " << k;
      }
    }
    longest_gap = std::max(longest_gap, s.LongestGapAfter(killed));
  }
  const std::string log = cluster.router().process->Log();
  const int greedy_moved = Count(log, "request greedy-", "resuming it on");
  const int sampled_moved = Count(log, "request sampled-", "resuming it on");
  std::printf("[figure] C5 SIGKILL of 1 of 2 decode workers under 32 streams (24 greedy, 8 "
              "seeded samples): 32 complete, all token-identical; %d greedy and %d sampled "
              "streams resumed elsewhere; the longest gap a client saw: %.0f ms\n",
              greedy_moved, sampled_moved, absl::ToDoubleMilliseconds(longest_gap));
  // Round robin alternates the workers: half of the streams ran on the killed one (the first
  // greedy ones may have finished already on a slow machine).
  EXPECT_EQ(sampled_moved, kSampled / 2) << log;
  EXPECT_GE(greedy_moved, kGreedy / 4) << log;
  EXPECT_LE(greedy_moved, kGreedy / 2) << log;
  EXPECT_LT(longest_gap, absl::Seconds(2));
}

// C5 with --migration-limit 0: the killed worker's streams end UNAVAILABLE within 2 s with a
// message that says so; the other worker's finish; new requests avoid the dead worker.
TEST(MigrationTest, WithMigrationOffAKilledWorkersStreamsEndUnavailable) {
  t::ClusterSpec spec =
      t::Spec("stories260K", 0, 2, 1, 1, {"--policy", "round_robin", "--migration-limit", "0"});
  spec.decode_flags = {"--debug-step-delay", "15ms"};
  t::Cluster cluster(spec);
  WaitRegistered(cluster.decode(1));
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  constexpr int kShort = 60;
  std::vector<GenerateRequest> requests(4, t::GreedyIds(cases[0].prompt_ids, kShort));
  std::vector<std::unique_ptr<Stream>> streams = StartInTurn(cluster, requests);
  cluster.decode(0).process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ReadAllToEnd(streams);
  int unavailable = 0, completed = 0;
  for (const auto& s : streams) {
    if (s->status.ok()) {
      ++completed;
      EXPECT_EQ(s->ids, Prefix(cases[0].completion_ids, kShort));
      continue;
    }
    ++unavailable;
    EXPECT_EQ(s->status.error_code(), grpc::StatusCode::UNAVAILABLE) << s->status.error_message();
    EXPECT_NE(s->status.error_message().find("--migration-limit 0"), std::string::npos)
        << s->status.error_message();
    EXPECT_LT(s->ended - killed, absl::Seconds(2));
    EXPECT_EQ(s->ids, Prefix(cases[0].completion_ids, s->ids.size())) << "tokens before the end";
  }
  EXPECT_EQ(unavailable, 2);
  EXPECT_EQ(completed, 2);
  for (int i = 0; i < 2; ++i) {
    const t::Generated got = t::Generate(cluster.stub(), t::GreedyIds(cases[1].prompt_ids, 16));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.ids, Prefix(cases[1].completion_ids, 16));
  }
}

// A decode worker that hangs (SIGSTOP: its connections stay open, it sends nothing): its streams
// resume on the other worker once --token-gap-timeout passes, with the same tokens.
TEST(MigrationTest, AHungDecodeWorkersStreamsResumeAfterTheTokenGapTimeout) {
  t::ClusterSpec spec = t::Spec("stories260K", 0, 2, 1, 1,
                                {"--policy", "round_robin", "--token-gap-timeout", "500ms"});
  spec.decode_flags = {"--debug-step-delay", "15ms"};
  t::Cluster cluster(spec);
  WaitRegistered(cluster.decode(1));
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(t::GreedyIds(cases[i].prompt_ids, kTokens));
  std::vector<std::unique_ptr<Stream>> streams = StartInTurn(cluster, requests);
  cluster.decode(0).process->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ReadAllToEnd(streams);
  cluster.decode(0).process->Signal(SIGCONT);
  absl::Duration longest_gap;
  for (int i = 0; i < 4; ++i) {
    const Stream& s = *streams[static_cast<size_t>(i)];
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.ids, Prefix(cases[static_cast<size_t>(i)].completion_ids, kTokens));
    longest_gap = std::max(longest_gap, s.LongestGapAfter(stopped));
  }
  std::printf("[figure] hung (SIGSTOPped) decode worker, --token-gap-timeout 500ms: its streams "
              "resumed elsewhere after a gap of %.0f ms at most\n",
              absl::ToDoubleMilliseconds(longest_gap));
  EXPECT_GE(longest_gap, absl::Milliseconds(450));
  // Well before the keepalive (1 s ping + 2 s timeout) or the heartbeat expiry (3 s).
  EXPECT_LT(longest_gap, absl::Milliseconds(2000));
}

// A call that brings no deadline still has one per stage: a decode worker whose steps take 1 s
// misses --first-token-timeout (300 ms) on each of the 3 attempts, and the request ends
// DEADLINE_EXCEEDED naming the flag after about 0.9 s instead of waiting on the worker.
TEST(StageTimeoutTest, ACallWithoutADeadlineEndsAtItsStagesTimeouts) {
  t::ClusterSpec spec = t::Spec("stories260K", 0, 1, 1, 1, {"--first-token-timeout", "300ms"});
  spec.decode_flags = {"--debug-step-delay", "1s"};
  t::Cluster cluster(spec);
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  grpc::ClientContext context;  // no deadline
  const absl::Time start = absl::Now();
  const t::Generated got = t::Generate(cluster.stub(), t::GreedyIds(c.prompt_ids, 8), &context);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("--first-token-timeout"), std::string::npos)
      << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("3 attempts"), std::string::npos)
      << got.status.error_message();
  std::printf("[figure] no client deadline, a decode worker with 1 s steps, "
              "--first-token-timeout 300ms: DEADLINE_EXCEEDED after %.0f ms (3 attempts)\n",
              absl::ToDoubleMilliseconds(took));
  EXPECT_GE(took, absl::Milliseconds(850));
  EXPECT_LT(took, absl::Milliseconds(2500));
}

// C6: a prefill worker SIGKILLed while it prefills (each prefill step takes 500 ms here): the
// router retries the request on the other prefill worker, it completes with the golden ids,
// and the decode worker's reservation for the failed attempt is freed within the KV timeout:
// its writer had attached, so KV fencing holds its pages until lease + grace (a dead writer
// sends no abort completion; kvtransfer/README.md "Fencing"). The lease is 2 s here.
TEST(PrefillFailureTest, AKilledPrefillWorkersRequestIsRetriedElsewhereAndCompletes) {
  t::ClusterSpec spec = t::Spec("stories260K", 2, 1, 1, 1);
  spec.prefill_flags = {"--debug-step-delay", "500ms"};
  spec.decode_flags = {"--lease-ms", "2000"};
  t::Cluster cluster(spec);
  WaitRegistered(cluster.prefill(0));
  WaitRegistered(cluster.prefill(1));
  const std::string decode = cluster.decode(0).address;
  const int decode_free = t::FreePages(decode, true);
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  t::Generated got;
  std::thread client([&] { got = t::Generate(cluster.stub(), t::GreedyIds(c.prompt_ids, 40)); });
  // The prefill worker that has the prompt (its load counts it at once).
  const int victim = FirstOfTwoThat([&](int i) {
    auto stub = estuary::v1::PrefillWorker::NewStub(
        grpc::CreateChannel(cluster.prefill(i).address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    estuary::v1::WorkerLoad load;
    return stub->GetLoad(&context, {}, &load).ok() && load.running_sequences() > 0;
  });
  ASSERT_GE(victim, 0) << "no prefill worker took the prompt\n" << cluster.Logs();
  cluster.prefill(victim).process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  client.join();
  const absl::Duration finished_after = absl::Now() - killed;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n"
                               << cluster.router().process->Log();
  EXPECT_EQ(got.ids, Prefix(c.completion_ids, 40));
  // Prefilled again on the other worker (a 500 ms step), not on the decode worker.
  EXPECT_GE(finished_after, absl::Milliseconds(450));
  const std::string router_log = cluster.router().process->Log();
  EXPECT_EQ(Count(router_log, "trying another worker"), 1) << router_log;
  // The first attempt's reservation went back: the router aborted it on the decode worker, and
  // its fenced pages return by lease (2 s from the reservation, before the kill) + grace (1 s).
  const absl::Time back_by = killed + absl::Seconds(5);
  while (t::FreePages(decode, true) != decode_free && absl::Now() < back_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(t::FreePages(decode, true), decode_free);
  std::printf("[figure] C6 SIGKILL of a prefill worker mid-prefill: retried on the other, "
              "completed %.0f ms after the kill (prefill steps of 500 ms); the failed attempt's "
              "pages back %.0f ms after the kill (lease 2 s + grace 1 s)\n",
              absl::ToDoubleMilliseconds(finished_after),
              absl::ToDoubleMilliseconds(absl::Now() - killed));
}

// A decode worker SIGKILLed while the prefill worker pushes its request's KV: the push fails on
// the prefill worker, which says the failure was its peer's (rpc/peer_failure.h), so the router
// drops and avoids the decode worker, keeps the prefill worker, and the request completes on the
// other decode worker with the golden ids. Before, the router dropped the healthy prefill worker
// for its peer's death.
TEST(PrefillFailureTest, ADecodeWorkerKilledDuringThePushCostsThePrefillWorkerNothing) {
  t::ClusterSpec spec = t::Spec("stories260K", 1, 2, 1, 1);
  spec.prefill_flags = {"--debug-step-delay", "500ms"};
  t::Cluster cluster(spec);
  WaitRegistered(cluster.prefill(0));
  WaitRegistered(cluster.decode(0));
  WaitRegistered(cluster.decode(1));
  const int free_pages[2] = {t::FreePages(cluster.decode(0).address, true),
                             t::FreePages(cluster.decode(1).address, true)};
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  t::Generated got;
  std::thread client([&] { got = t::Generate(cluster.stub(), t::GreedyIds(c.prompt_ids, 40)); });
  // The decode worker holding the request's reservation (its free pages drop at Reserve); the
  // prefill worker's 500 ms step is then under way, pushing into it.
  const int victim = FirstOfTwoThat(
      [&](int i) { return t::FreePages(cluster.decode(i).address, true) < free_pages[i]; });
  ASSERT_GE(victim, 0) << "no decode worker reserved pages\n" << cluster.Logs();
  cluster.decode(victim).process->Signal(SIGKILL);
  client.join();
  const std::string router_log = cluster.router().process->Log();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << router_log;
  EXPECT_EQ(got.ids, Prefix(c.completion_ids, 40));
  EXPECT_EQ(Count(router_log, "prefill worker", "unreachable; dropped"), 0) << router_log;
  EXPECT_EQ(Count(router_log, "decode worker", "unreachable; dropped"), 1) << router_log;
  EXPECT_EQ(Count(router_log, "trying another worker"), 1) << router_log;
}

// C9: both decode workers restarted in turn (SIGTERM, wait for the exit, start again) while six
// clients send requests back to back: not one error, every answer the golden one; each
// draining worker hands its streams back at once (they resume on the other) and exits 0.
TEST(RollingRestartTest, RestartingEachDecodeWorkerUnderLoadShowsNoClientAnError) {
  t::ClusterSpec spec = t::Spec("stories260K", 1, 2, 1, 1);
  spec.decode_flags = {"--debug-step-delay", "5ms"};
  t::Cluster cluster(spec);
  WaitRegistered(cluster.decode(1));
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0}, wrong{0};
  std::vector<std::string> errors;
  absl::Mutex errors_mu;
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      for (int n = 0; !stop.load(); ++n) {
        const t::GoldenCase& golden = cases[static_cast<size_t>(c + n) % cases.size()];
        const t::Generated got =
            t::Generate(cluster.stub(), t::GreedyIds(golden.prompt_ids, 100));
        if (!got.status.ok()) {
          failed.fetch_add(1);
          absl::MutexLock lock(&errors_mu);
          errors.push_back(got.status.error_message());
        } else if (got.ids != Prefix(golden.completion_ids, 100)) {
          wrong.fetch_add(1);
        } else {
          completed.fetch_add(1);
        }
      }
    });
  }
  auto wait_for = [&](int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (completed.load() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  };
  // Until decode worker `d` streams something (its live load says so), so each drain has work.
  auto wait_busy = [&](int d) {
    auto stub = estuary::v1::DecodeWorker::NewStub(
        grpc::CreateChannel(cluster.decode(d).address, grpc::InsecureChannelCredentials()));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      estuary::v1::WorkerLoad load;
      if (stub->GetLoad(&context, {}, &load).ok() && load.running_sequences() > 0) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
  };
  std::vector<double> drain_ms;
  for (int d = 0; d < 2; ++d) {
    wait_for(completed.load() + 6);
    wait_busy(d);
    cluster.decode(d).process->Signal(SIGTERM);
    const absl::Time signalled = absl::Now();
    absl::StatusOr<int> exited = cluster.decode(d).process->Wait(absl::Seconds(20));
    ASSERT_TRUE(exited.ok()) << exited.status();
    EXPECT_EQ(*exited, 0) << cluster.decode(d).process->Log();
    drain_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - signalled));
    cluster.RestartDecode(d);
  }
  wait_for(completed.load() + 6);
  stop = true;
  for (std::thread& client : clients) client.join();
  const std::string log = cluster.router().process->Log();
  const int migrations = Count(log, "resuming it on");
  const int retries = Count(log, "trying another worker");
  std::printf("[figure] C9 rolling restart of 2 decode workers under 6 clients: %d requests "
              "completed, %d failed, %d wrong; drains took %.0f / %.0f ms; %d streams resumed "
              "and %d requests retried elsewhere\n",
              completed.load(), failed.load(), wrong.load(), drain_ms[0], drain_ms[1], migrations,
              retries);
  EXPECT_GE(migrations + retries, 2) << "each drain moved work off its worker";
  EXPECT_EQ(failed.load(), 0) << (errors.empty() ? "" : errors.front()) << "\n"
                              << cluster.router().process->Log();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(completed.load(), 18);
  for (double ms : drain_ms) EXPECT_LT(ms, 5000.0) << "a drain waited instead of handing back";
}

}  // namespace
}  // namespace estuary
