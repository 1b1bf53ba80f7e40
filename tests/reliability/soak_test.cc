// The soak (reliability C1): a router with 2 prefill and 2 decode workers (stories260K) under
// 64 gRPC streams and 16 OpenAI SSE streams of mixed prompt and output lengths, for
// $ESTUARY_SOAK_SECONDS (default 120, CI; 1800 for the nightly run), of which the first half
// warms the processes up. Afterwards:
//   - no request was lost: each ended Complete (gRPC) / with [DONE] and a finish_reason (SSE),
//     or with a typed error (a gRPC status other than INTERNAL / UNKNOWN, an HTTP 4xx or 503
//     with an error body);
//   - every worker's free KV pages are back to their baseline (GetLoad);
//   - no worker's RSS grew 5 % or more from the end of the warm-up, and no process's open fds
//     and threads grew (each measured idle, /proc/PID).
// Known miss: the router's RSS grows 9-13 % (about 3.4 MB) over 2 minutes of this load (README,
// "Reliability checklist" C1), its every-10 s samples flattening towards the end. About half is
// PromptHomes (router_service.h: the prompts of the last 4,096 requests, 60 s) filling after the
// warm-up: with its capacity cut to 64 the growth was 6.6 %. The rest is not explained yet; it
// is not glibc's per-thread arenas (MALLOC_ARENA_MAX=2 changed nothing), which was most of the
// 20-24 % a thread-per-stream router (~290 threads) showed before the callback API (issue 14
// item 7; ~36 threads now). Its bound here is 120 %, which a leak of a few KiB per request
// would still break.
// Why half: under this load a decode worker's RSS climbs by 3-4 MB (~9 %) over its first minute
// and then flattens (the every-10 s samples), while its heap in use stays flat at ~4 MB from the
// first 10 s on (a tcmalloc heap profile of both decode workers, dumps every 10 s, in-use total
// 3.8-4.2 MB in every dump): the allocator settling into its working set, not a leak. Measured
// from the end of a sixth (20 s), the settling alone came to 5.1-5.6 % in one CI run; from half
// way, what a leak adds still shows: at ~30 requests/s, 1 KiB per request is ~1.8 MB a minute,
// over 4 % of a 40 MB worker.
// The figures go out as one JSON line ("[figure] C1 soak {...}").

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/proc_stats.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;

constexpr int kGrpcStreams = 64;
constexpr int kSseStreams = 16;
constexpr int kContext = 512;  // stories260K
constexpr int kVocab = 512;

absl::Duration SoakDuration() {
  int seconds = 120;
  if (const char* env = std::getenv("ESTUARY_SOAK_SECONDS"); env != nullptr) {
    if (!absl::SimpleAtoi(env, &seconds) || seconds < 12) seconds = 120;
  }
  return absl::Seconds(seconds);
}

// How the requests ended, over all clients.
struct Tally {
  std::atomic<int64_t> completed{0}, typed_errors{0}, lost{0}, tokens{0};
  absl::Mutex mu;
  std::map<std::string, int> typed;  // "grpc RESOURCE_EXHAUSTED", "http 429", ...
  std::vector<std::string> lost_examples;

  void Typed(const std::string& what) {
    typed_errors.fetch_add(1);
    absl::MutexLock lock(&mu);
    ++typed[what];
  }
  void Lost(const std::string& why) {
    lost.fetch_add(1);
    absl::MutexLock lock(&mu);
    if (lost_examples.size() < 5) lost_examples.push_back(why);
  }
};

// A random prompt of 1..300 token ids and an output length that fits the context: short and
// long prompts, short and long outputs, mixed.
struct Shape {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  bool ignore_eos = false;
};

Shape RandomShape(std::mt19937& random) {
  auto uniform = [&random](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(random);
  };
  Shape s;
  const int length = uniform(0, 3) == 0 ? uniform(100, 300) : uniform(1, 40);
  s.prompt.push_back(1);  // BOS
  for (int i = 1; i < length; ++i) s.prompt.push_back(uniform(3, kVocab - 1));
  const int room = kContext - length;
  s.max_tokens = std::min(room, uniform(0, 3) == 0 ? uniform(100, 200) : uniform(1, 32));
  s.ignore_eos = uniform(0, 1) == 1;
  return s;
}

void GrpcClient(estuary::v1::Inference::Stub& stub, int seed, const std::atomic<bool>& stop,
                Tally& tally) {
  std::mt19937 random(static_cast<uint32_t>(seed));
  while (!stop.load()) {
    const Shape shape = RandomShape(random);
    estuary::v1::GenerateRequest request = t::GreedyIds(shape.prompt, shape.max_tokens);
    request.mutable_sampling()->set_ignore_eos(shape.ignore_eos);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    const t::Generated got = t::Generate(stub, request, &context);
    const grpc::StatusCode code = got.status.error_code();
    if (got.status.ok() && got.complete.has_usage()) {
      tally.completed.fetch_add(1);
      tally.tokens.fetch_add(static_cast<int64_t>(got.ids.size()));
    } else if (got.status.ok()) {
      tally.Lost("a gRPC stream ended OK without its Complete message");
    } else if (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
               got.status.error_message().empty()) {
      tally.Lost(absl::StrCat("gRPC ", code, ": ", got.status.error_message()));
    } else {
      tally.Typed(absl::StrCat("grpc ", code));
    }
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 50)(random)));
  }
}

void SseClient(const std::string& http_address, int seed, const std::atomic<bool>& stop,
               Tally& tally) {
  std::mt19937 random(static_cast<uint32_t>(seed));
  httplib::Client http("http://" + http_address);
  http.set_read_timeout(60);
  while (!stop.load()) {
    const Shape shape = RandomShape(random);
    const nlohmann::json body = {{"prompt", shape.prompt}, {"max_tokens", shape.max_tokens},
                                 {"temperature", 0},       {"ignore_eos", shape.ignore_eos},
                                 {"stream", true}};
    const httplib::Result result = http.Post("/v1/completions", body.dump(), "application/json");
    if (!result) {
      tally.Lost(absl::StrCat("SSE request failed: ", httplib::to_string(result.error())));
    } else if (result->status == 200) {
      // The last event before [DONE] that names a finish_reason ends the choice.
      const std::string& text = result->body;
      const bool done = text.find("data: [DONE]") != std::string::npos;
      const bool finished = text.find("\"finish_reason\":\"") != std::string::npos;
      if (done && finished) {
        tally.completed.fetch_add(1);
      } else {
        tally.Lost(absl::StrCat("an SSE stream without ", done ? "a finish_reason" : "[DONE]"));
      }
    } else if ((result->status >= 400 && result->status < 500) || result->status == 503) {
      tally.Typed(absl::StrCat("http ", result->status));
    } else {
      tally.Lost(absl::StrCat("HTTP ", result->status, ": ", result->body.substr(0, 200)));
    }
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 50)(random)));
  }
}

// Each process's RSS (KiB), sampled every 10 s of the load: the trend behind the end figures.
using RssSamples = std::map<std::string, std::vector<int64_t>>;

// Runs every client for `duration`, then waits for them to finish their requests. With
// `samples`, reads the RSS of `pids` (by name) every 10 s meanwhile.
void Load(t::Cluster& cluster, const std::string& http_address, absl::Duration duration,
          int seed, Tally& tally, const std::map<std::string, pid_t>& pids = {},
          RssSamples* samples = nullptr) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < kGrpcStreams; ++i) {
    clients.emplace_back([&, i] { GrpcClient(cluster.stub(), seed + i, stop, tally); });
  }
  for (int i = 0; i < kSseStreams; ++i) {
    clients.emplace_back([&, i] { SseClient(http_address, seed + 1000 + i, stop, tally); });
  }
  const absl::Time end = absl::Now() + duration;
  while (absl::Now() < end) {
    absl::SleepFor(std::min(absl::Seconds(10), end - absl::Now()));
    if (samples == nullptr) continue;
    for (const auto& [name, pid] : pids) {
      (*samples)[name].push_back(t::ReadProcStats(pid).value_or(t::ProcStats{}).rss_kib);
    }
  }
  stop = true;
  for (std::thread& c : clients) c.join();
}

struct Process {
  std::string name;
  ServingProcess* serving;
  bool decode = false, worker = false;
  t::ProcStats warm, end;
  int pages_warm = 0, pages_end = 0;
};

// Waits until every worker's free pages stop changing (idle), then reads every process.
void Measure(std::vector<Process>& processes, bool warm) {
  for (Process& p : processes) {
    if (!p.worker) continue;
    int last = -2;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (absl::Now() < until) {
      const int now = t::FreePages(p.serving->address, p.decode);
      if (now == last) break;
      last = now;
      absl::SleepFor(absl::Milliseconds(300));
    }
    (warm ? p.pages_warm : p.pages_end) = last;
  }
  absl::SleepFor(absl::Seconds(1));  // idle threads of the last calls settle
  for (Process& p : processes) {
    auto stats = t::ReadProcStats(p.serving->process->pid());
    EXPECT_TRUE(stats.ok()) << p.name << ": " << stats.status();
    (warm ? p.warm : p.end) = stats.value_or(t::ProcStats{});
  }
}

TEST(SoakTest, MixedGrpcAndSseLoadLosesNothingAndLeaksNothing) {
  const absl::Duration total = SoakDuration();
  const absl::Duration warm_up = total / 2;
  // 8 MiB KV pools (408 pages): the warm-up cycles every page through use and the prefix cache,
  // so that RSS after it includes the whole pool (pages are touched on first use, not at start).
  t::ClusterSpec spec = t::Spec("stories260K", 2, 2, 1, 1, {"--http-port", "0"});
  spec.decode_flags = {"--kv-cache-bytes", "8388608"};
  spec.prefill_flags = {"--kv-cache-bytes", "8388608"};
  t::Cluster cluster(spec);
  const std::string http_address = t::RouterHttpAddress(cluster);
  ASSERT_FALSE(http_address.empty()) << cluster.Logs();
  std::vector<Process> processes = {{"router", const_cast<ServingProcess*>(&cluster.router())},
                                    {"decode0", &cluster.decode(0), true, true},
                                    {"decode1", &cluster.decode(1), true, true},
                                    {"prefill0", &cluster.prefill(0), false, true},
                                    {"prefill1", &cluster.prefill(1), false, true}};
  std::vector<int> pages_start;
  for (Process& p : processes) {
    if (p.worker) pages_start.push_back(t::FreePages(p.serving->address, p.decode));
  }

  Tally warm_tally;
  Load(cluster, http_address, warm_up, 1, warm_tally);
  Measure(processes, /*warm=*/true);
  Tally tally;
  std::map<std::string, pid_t> pids;
  for (const Process& p : processes) pids[p.name] = p.serving->process->pid();
  RssSamples samples;
  const absl::Time start = absl::Now();
  Load(cluster, http_address, total - warm_up, 100000, tally, pids, &samples);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Measure(processes, /*warm=*/false);

  nlohmann::json figures = {
      {"test", "C1 soak"},
      {"seconds", seconds},
      {"warm_up_seconds", absl::ToDoubleSeconds(warm_up)},
      {"grpc_streams", kGrpcStreams},
      {"sse_streams", kSseStreams},
      {"requests", tally.completed + tally.typed_errors + tally.lost},
      {"completed", tally.completed.load()},
      {"typed_errors", tally.typed},
      {"lost", tally.lost.load()},
      {"grpc_tokens", tally.tokens.load()},
      {"warm_up_requests", warm_tally.completed + warm_tally.typed_errors + warm_tally.lost},
      {"warm_up_lost", warm_tally.lost.load()}};
  size_t worker = 0;
  for (const Process& p : processes) {
    nlohmann::json& f = figures["processes"][p.name];
    f = {{"rss_kib_warm", p.warm.rss_kib}, {"rss_kib_end", p.end.rss_kib},
         {"rss_growth_percent",
          p.warm.rss_kib > 0 ? 100.0 * (p.end.rss_kib - p.warm.rss_kib) / p.warm.rss_kib : 0.0},
         {"rss_anon_kib_warm", p.warm.rss_anon_kib}, {"rss_anon_kib_end", p.end.rss_anon_kib},
         {"rss_file_kib_warm", p.warm.rss_file_kib}, {"rss_file_kib_end", p.end.rss_file_kib},
         {"threads_warm", p.warm.threads}, {"threads_end", p.end.threads},
         {"fds_warm", p.warm.fds}, {"fds_end", p.end.fds}};
    f["rss_kib_every_10s"] = samples[p.name];
    if (p.worker) {
      f["free_pages_start"] = pages_start[worker++];
      f["free_pages_warm"] = p.pages_warm;
      f["free_pages_end"] = p.pages_end;
    }
  }
  std::printf("[figure] C1 soak %s\n", figures.dump().c_str());

  EXPECT_EQ(tally.lost.load() + warm_tally.lost.load(), 0)
      << (tally.lost_examples.empty() ? warm_tally.lost_examples.front()
                                      : tally.lost_examples.front());
  EXPECT_GT(tally.completed.load(), 10 * (kGrpcStreams + kSseStreams)) << "too little load";
  worker = 0;
  for (const Process& p : processes) {
    if (p.worker) {
      EXPECT_EQ(p.pages_end, pages_start[worker]) << p.name << " leaked KV pages";
      EXPECT_EQ(p.pages_warm, pages_start[worker++]) << p.name << " leaked KV pages (warm-up)";
    }
    const int64_t percent = p.name == "router" ? 120 : 105;  // the router's: see the top
    EXPECT_LT(p.end.rss_kib, p.warm.rss_kib * percent / 100)
        << p.name << " RSS grew " << percent - 100 << " % or more";
    // Flat: idle gRPC threads come and go by one or two (the sync server's pollers).
    EXPECT_LE(p.end.fds, p.warm.fds + 2) << p.name << " holds more open files";
    EXPECT_LE(p.end.threads, p.warm.threads + 2) << p.name << " runs more threads";
  }
}

}  // namespace
}  // namespace estuary
