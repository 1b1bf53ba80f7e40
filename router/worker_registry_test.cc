// WorkerRegistry: registration checks, expiry, dead workers, the placement policies and pair
// compatibility. Time is passed in, so nothing sleeps.

#include "router/worker_registry.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace estuary::router {
namespace {

using estuary::v1::WorkerInfo;
using estuary::v1::WorkerLoad;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

ServedModel Model() { return ServedModel{"stories", 512, 512, 5}; }

WorkerInfo Info(const std::string& id, estuary::v1::WorkerRole role, int block_size = 16,
                const std::string& fingerprint_model = "stories") {
  WorkerInfo info;
  info.set_worker_id(id);
  info.set_role(role);
  info.set_address(absl::StrCat(id, ":1"));
  info.set_model_id("stories");
  info.set_tp_size(1);
  info.set_block_size(block_size);
  info.mutable_fingerprint()->set_model_id(fingerprint_model);
  info.mutable_fingerprint()->set_dtype("f32");
  info.mutable_fingerprint()->mutable_layout()->set_block_size(block_size);
  info.set_context_length(512);
  info.set_vocab_size(512);
  info.set_num_layers(5);
  return info;
}
WorkerInfo Decode(const std::string& id, int block_size = 16) {
  return Info(id, estuary::v1::WORKER_ROLE_DECODE, block_size);
}
WorkerInfo Prefill(const std::string& id, int block_size = 16) {
  return Info(id, estuary::v1::WORKER_ROLE_PREFILL, block_size);
}
WorkerLoad Running(int sequences) {
  WorkerLoad load;
  load.set_running_sequences(sequences);
  load.set_free_pages(100);
  load.set_total_pages(100);
  return load;
}

RegistryOptions WithPolicy(Policy policy) {
  RegistryOptions options;
  options.policy = policy;
  return options;
}

std::vector<int32_t> Prompt(int n, int32_t first) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

TEST(WorkerRegistryTest, RefusesMalformedAndForeignWorkers) {
  WorkerRegistry registry(Model(), RegistryOptions());
  WorkerInfo info = Decode("d");
  info.clear_worker_id();
  EXPECT_EQ(registry.Register(info, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  info = Decode("d");
  info.set_role(estuary::v1::WORKER_ROLE_UNSPECIFIED);
  EXPECT_EQ(registry.Register(info, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  info = Decode("d");
  info.clear_address();
  EXPECT_EQ(registry.Register(info, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  info = Decode("d");
  info.set_block_size(0);
  EXPECT_EQ(registry.Register(info, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
  info = Decode("d");
  info.set_model_id("llama");
  const absl::Status other = registry.Register(info, {}, kT0);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("llama"), std::string::npos) << other;
  info = Decode("d");
  info.set_num_layers(6);
  EXPECT_EQ(registry.Register(info, {}, kT0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0).empty());
  EXPECT_TRUE(registry.Register(Decode("d"), {}, kT0).ok());
  EXPECT_EQ(registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0).size(), 1u);
}

TEST(WorkerRegistryTest, AWorkerWhoseHeartbeatsLapseIsDropped) {
  RegistryOptions options;
  options.worker_timeout = absl::Seconds(3);
  WorkerRegistry registry(Model(), options);
  ASSERT_TRUE(registry.Register(Decode("d1"), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("d2"), {}, kT0).ok());
  // d1 keeps beating, d2 falls silent.
  EXPECT_TRUE(registry.Heartbeat("d1", Running(1), kT0 + absl::Seconds(2)));
  EXPECT_EQ(registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0 + absl::Seconds(3)).size(), 2u);
  const auto live = registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0 + absl::Milliseconds(3100));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].info.worker_id(), "d1");
  EXPECT_EQ(live[0].load.running_sequences(), 1);
  // The dropped worker hears "unknown" and registers again.
  EXPECT_FALSE(registry.Heartbeat("d2", {}, kT0 + absl::Seconds(4)));
  EXPECT_FALSE(registry.Heartbeat("never", {}, kT0));
  ASSERT_TRUE(registry.Register(Decode("d2"), {}, kT0 + absl::Seconds(4)).ok());
  EXPECT_TRUE(registry.Heartbeat("d2", {}, kT0 + absl::Seconds(4)));
}

// A registration cannot take over a live worker's id (and so its prompts) from another address
// or role; the worker itself refreshes it, and the id is free again once the worker is dropped.
TEST(WorkerRegistryTest, ALiveWorkersIdCannotBeTakenOver) {
  RegistryOptions options;
  options.worker_timeout = absl::Seconds(3);
  WorkerRegistry registry(Model(), options);
  ASSERT_TRUE(registry.Register(Decode("d1"), {}, kT0).ok());
  WorkerInfo impostor = Decode("d1");
  impostor.set_address("198.18.0.66:7000");
  const absl::Status taken = registry.Register(impostor, {}, kT0 + absl::Seconds(1));
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  EXPECT_NE(taken.message().find("198.18.0.66:7000"), absl::string_view::npos) << taken;
  EXPECT_EQ(registry.Register(Prefill("d1"), {}, kT0 + absl::Seconds(1)).code(),
            absl::StatusCode::kAlreadyExists);
  auto live = registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0 + absl::Seconds(1));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].info.address(), Decode("d1").address());
  EXPECT_TRUE(registry.Register(Decode("d1"), Running(2), kT0 + absl::Seconds(2)).ok());
  // Silent past its timeout: dropped, and the id may be registered from elsewhere.
  EXPECT_TRUE(registry.Register(impostor, {}, kT0 + absl::Seconds(6)).ok());
}

// Under mutual TLS the registering certificate's identity holds the id too: another identity
// cannot take it over from the same address, nor heartbeat or unregister it.
TEST(WorkerRegistryTest, ALiveWorkersIdStaysWithItsCertificateIdentity) {
  WorkerRegistry registry(Model(), RegistryOptions{});
  ASSERT_TRUE(registry.Register(Decode("d1"), {}, kT0, "estuary-decode-0").ok());
  const absl::Status taken =
      registry.Register(Decode("d1"), {}, kT0 + absl::Seconds(1), "estuary-other");
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  EXPECT_NE(taken.message().find("another certificate identity"), absl::string_view::npos)
      << taken;
  EXPECT_FALSE(registry.Heartbeat("d1", Running(1), kT0 + absl::Seconds(1), "estuary-other"));
  EXPECT_EQ(registry.Unregister("d1", "estuary-other").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Heartbeat("d1", Running(1), kT0 + absl::Seconds(1), "estuary-decode-0"));
  EXPECT_TRUE(registry.Unregister("d1", "estuary-decode-0").ok());
}

TEST(WorkerRegistryTest, MarkDeadDropsAtOnce) {
  WorkerRegistry registry(Model(), RegistryOptions());
  ASSERT_TRUE(registry.Register(Decode("d1"), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("d2"), {}, kT0).ok());
  EXPECT_TRUE(registry.MarkDead("d1"));
  EXPECT_FALSE(registry.MarkDead("d1"));
  for (int i = 0; i < 4; ++i) {
    auto placement = registry.Choose(Prompt(4, 10), /*local=*/true, kT0);
    ASSERT_TRUE(placement.ok());
    EXPECT_EQ(placement->decode.info.worker_id(), "d2");
  }
  EXPECT_TRUE(registry.MarkDead("d2"));
  auto none = registry.Choose(Prompt(4, 10), /*local=*/true, kT0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
}

TEST(WorkerRegistryTest, RoundRobinTakesTurns) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kRoundRobin));
  for (const char* id : {"d1", "d2", "d3"}) ASSERT_TRUE(registry.Register(Decode(id), {}, kT0).ok());
  for (const char* id : {"p1", "p2"}) ASSERT_TRUE(registry.Register(Prefill(id), {}, kT0).ok());
  std::vector<std::string> decodes, prefills;
  for (int i = 0; i < 6; ++i) {
    auto placement = registry.Choose(Prompt(4, 10), /*local=*/false, kT0);
    ASSERT_TRUE(placement.ok()) << placement.status();
    ASSERT_TRUE(placement->prefill.has_value());
    decodes.push_back(placement->decode.info.worker_id());
    prefills.push_back(placement->prefill->info.worker_id());
  }
  EXPECT_EQ(decodes, (std::vector<std::string>{"d1", "d2", "d3", "d1", "d2", "d3"}));
  EXPECT_EQ(prefills, (std::vector<std::string>{"p1", "p2", "p1", "p2", "p1", "p2"}));
}

TEST(WorkerRegistryTest, LeastLoadedUsesReportedLoadAndInFlightCounts) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kLeastLoaded));
  ASSERT_TRUE(registry.Register(Decode("busy"), Running(5), kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("idle"), Running(0), kT0).ok());
  // The idle one gets requests until the router's own in-flight count reaches the busy one's
  // reported load; then fewer requests in flight through this router break the tie.
  std::vector<std::string> chosen;
  for (int i = 0; i < 7; ++i) {
    auto placement = registry.Choose(Prompt(4, 10), /*local=*/true, kT0);
    ASSERT_TRUE(placement.ok());
    chosen.push_back(placement->decode.info.worker_id());
  }
  EXPECT_EQ(chosen, (std::vector<std::string>{"idle", "idle", "idle", "idle", "idle", "busy",
                                              "busy"}));
  // Releasing brings the count back.
  for (int i = 0; i < 5; ++i) registry.Release("idle", 4);
  auto placement = registry.Choose(Prompt(4, 10), /*local=*/true, kT0);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode.info.worker_id(), "idle");
  EXPECT_EQ(placement->decode.in_flight, 1);

  // Prefill: by queued prompt tokens.
  WorkerLoad queued;
  queued.set_queued_prefill_tokens(1000);
  ASSERT_TRUE(registry.Register(Prefill("p-queued"), queued, kT0).ok());
  ASSERT_TRUE(registry.Register(Prefill("p-free"), {}, kT0).ok());
  placement = registry.Choose(Prompt(600, 1), /*local=*/false, kT0);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill->info.worker_id(), "p-free");
  placement = registry.Choose(Prompt(600, 1), /*local=*/false, kT0);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill->info.worker_id(), "p-free");  // 600 in flight < 1000
  placement = registry.Choose(Prompt(600, 1), /*local=*/false, kT0);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill->info.worker_id(), "p-queued");  // 1200 in flight > 1000
}

TEST(WorkerRegistryTest, PrefixAwareKeepsASharedPrefixOnOneWorker) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kPrefixAware));
  for (const char* id : {"d1", "d2", "d3"}) ASSERT_TRUE(registry.Register(Decode(id), {}, kT0).ok());
  // Prompts that share their first two blocks (32 tokens) and differ after.
  std::vector<int32_t> a = Prompt(40, 100);
  std::vector<int32_t> b = Prompt(48, 100);
  b[40] = 7;
  auto first = registry.Choose(a, /*local=*/true, kT0);
  ASSERT_TRUE(first.ok());
  const std::string home = first->decode.info.worker_id();
  // A prompt of another prefix goes elsewhere (least loaded: the home worker has one in flight).
  auto other = registry.Choose(Prompt(40, 300), /*local=*/true, kT0);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->decode.info.worker_id(), home);
  for (int i = 0; i < 3; ++i) {
    auto again = registry.Choose(b, /*local=*/true, kT0);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->decode.info.worker_id(), home) << i;
  }
  // Shorter than a block: no affinity, least loaded (the third worker has nothing in flight).
  auto tiny = registry.Choose(Prompt(5, 100), /*local=*/true, kT0);
  ASSERT_TRUE(tiny.ok());
  EXPECT_NE(tiny->decode.info.worker_id(), home);
  // Too busy a home worker loses the affinity.
  ASSERT_TRUE(registry.Heartbeat(home, Running(kAffinityMaxImbalance + 10), kT0));
  auto overflow = registry.Choose(b, /*local=*/true, kT0);
  ASSERT_TRUE(overflow.ok());
  EXPECT_NE(overflow->decode.info.worker_id(), home);
}

TEST(WorkerRegistryTest, PrefixAwareFallsBackWhenTheHomeWorkerIsGone) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kPrefixAware));
  for (const char* id : {"d1", "d2"}) ASSERT_TRUE(registry.Register(Decode(id), {}, kT0).ok());
  auto first = registry.Choose(Prompt(32, 1), /*local=*/true, kT0);
  ASSERT_TRUE(first.ok());
  const std::string home = first->decode.info.worker_id();
  registry.MarkDead(home);
  auto next = registry.Choose(Prompt(32, 1), /*local=*/true, kT0);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->decode.info.worker_id(), home);
}

TEST(WorkerRegistryTest, PairsOnlyMatchingKvFormats) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kRoundRobin));
  ASSERT_TRUE(registry.Register(Decode("d16", 16), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Prefill("p32", 32), {}, kT0).ok());
  EXPECT_FALSE(registry.HasCompatiblePair(kT0));
  auto refused = registry.Choose(Prompt(4, 1), /*local=*/false, kT0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("KV format"), std::string::npos) << refused.status();

  ASSERT_TRUE(registry.Register(Decode("d32", 32), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Prefill("p16", 16), {}, kT0).ok());
  WorkerInfo other_format = Info("p16-other", estuary::v1::WORKER_ROLE_PREFILL, 16, "other");
  other_format.set_model_id("stories");
  ASSERT_TRUE(registry.Register(other_format, {}, kT0).ok());
  EXPECT_TRUE(registry.HasCompatiblePair(kT0));
  for (int i = 0; i < 8; ++i) {
    auto placement = registry.Choose(Prompt(4, 1), /*local=*/false, kT0);
    ASSERT_TRUE(placement.ok()) << placement.status();
    ASSERT_TRUE(placement->prefill.has_value());
    EXPECT_TRUE(Compatible(placement->decode.info, placement->prefill->info))
        << placement->decode.info.worker_id() << " with " << placement->prefill->info.worker_id();
    EXPECT_NE(placement->prefill->info.worker_id(), "p16-other");
  }
}

TEST(WorkerRegistryTest, NoWorkersIsUnavailable) {
  WorkerRegistry registry(Model(), RegistryOptions());
  EXPECT_EQ(registry.Choose(Prompt(4, 1), true, kT0).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(registry.Register(Decode("d"), {}, kT0).ok());
  EXPECT_TRUE(registry.Choose(Prompt(4, 1), true, kT0).ok());
  const auto no_prefill = registry.Choose(Prompt(4, 1), false, kT0);
  EXPECT_EQ(no_prefill.status().code(), absl::StatusCode::kUnavailable);
}

TEST(WorkerRegistryTest, PrefixBlockHashesChainFullBlocksOnly) {
  EXPECT_TRUE(PrefixBlockHashes(Prompt(15, 0), 16, 8).empty());
  const auto a = PrefixBlockHashes(Prompt(40, 0), 16, 8);
  ASSERT_EQ(a.size(), 2u);
  std::vector<int32_t> p = Prompt(40, 0);
  p[20] = 999;
  const auto b = PrefixBlockHashes(p, 16, 8);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  EXPECT_EQ(PrefixBlockHashes(Prompt(400, 0), 16, 3).size(), 3u);
}

TEST(WorkerRegistryTest, ParsesPolicies) {
  EXPECT_EQ(*ParsePolicy("round_robin"), Policy::kRoundRobin);
  EXPECT_EQ(*ParsePolicy("least_loaded"), Policy::kLeastLoaded);
  EXPECT_EQ(*ParsePolicy("prefix_aware"), Policy::kPrefixAware);
  EXPECT_EQ(ParsePolicy("random").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PolicyName(Policy::kPrefixAware), "prefix_aware");
}

}  // namespace
}  // namespace estuary::router

namespace estuary::router {
namespace {

TEST(WorkerRegistryDrainTest, UnregisterRemovesAtOnceAndUnknownIsNotFound) {
  WorkerRegistry registry(Model(), RegistryOptions());
  ASSERT_TRUE(registry.Register(Decode("d1"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("d2"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Unregister("d1").ok());
  const std::vector<WorkerView> live = registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].info.worker_id(), "d2");
  EXPECT_FALSE(registry.Heartbeat("d1", Running(0), kT0));  // it must register again
  EXPECT_EQ(registry.Unregister("d1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Unregister("never").code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryDrainTest, NotReadyWorkersGetNoWorkUntilReadyAgain) {
  WorkerRegistry registry(Model(), RegistryOptions());
  WorkerLoad not_ready = Running(0);
  not_ready.set_not_ready(true);
  ASSERT_TRUE(registry.Register(Decode("d1"), not_ready, kT0).ok());
  EXPECT_TRUE(registry.Live(estuary::v1::WORKER_ROLE_DECODE, kT0).empty());
  EXPECT_EQ(registry.Choose(Prompt(4, 1), /*local=*/true, kT0).status().code(),
            absl::StatusCode::kUnavailable);
  // Still known: heartbeats are accepted, and a ready one puts it back in rotation.
  ASSERT_TRUE(registry.Heartbeat("d1", Running(0), kT0 + absl::Milliseconds(500)));
  absl::StatusOr<Placement> placed =
      registry.Choose(Prompt(4, 1), /*local=*/true, kT0 + absl::Milliseconds(500));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->decode.info.worker_id(), "d1");
}

// Every way out of the registry is kept for TakeDropped (the router ends or resumes what ran
// there), once each, with its reason; Expire notices silent workers without a placement.
TEST(WorkerRegistryDrainTest, DropsAreKeptWithTheirReasonUntilTaken) {
  RegistryOptions options;
  options.worker_timeout = absl::Seconds(3);
  WorkerRegistry registry(Model(), options);
  ASSERT_TRUE(registry.Register(Decode("d1"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("d2"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Register(Prefill("p1"), {}, kT0).ok());
  EXPECT_TRUE(registry.TakeDropped().empty());
  EXPECT_TRUE(registry.MarkDead("d1"));
  ASSERT_TRUE(registry.Unregister("p1").ok());
  ASSERT_TRUE(registry.Heartbeat("d2", Running(0), kT0 + absl::Seconds(1)));
  registry.Expire(kT0 + absl::Seconds(5));
  const std::vector<DroppedWorker> dropped = registry.TakeDropped();
  ASSERT_EQ(dropped.size(), 3u);
  EXPECT_EQ(dropped[0].worker_id, "d1");
  EXPECT_STREQ(dropped[0].reason, "unreachable");
  EXPECT_EQ(dropped[1].worker_id, "p1");
  EXPECT_EQ(dropped[1].role, estuary::v1::WORKER_ROLE_PREFILL);
  EXPECT_STREQ(dropped[1].reason, "unregistered");
  EXPECT_EQ(dropped[2].worker_id, "d2");
  EXPECT_STREQ(dropped[2].reason, "expired");
  EXPECT_TRUE(registry.TakeDropped().empty());
}

// A request's later attempts pass over the workers that failed it, while another can serve.
TEST(WorkerRegistryTest, ChoosePassesOverWorkersToAvoidWhileOthersCanServe) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kRoundRobin));
  ASSERT_TRUE(registry.Register(Decode("d1"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("d2"), Running(0), kT0).ok());
  ASSERT_TRUE(registry.Register(Prefill("p1"), {}, kT0).ok());
  const std::vector<std::string> avoid = {"d1", "p1"};
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Placement> placed = registry.Choose(Prompt(4, 1), /*local=*/false, kT0, avoid);
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->decode.info.worker_id(), "d2");
    EXPECT_EQ(placed->prefill->info.worker_id(), "p1");  // the only prefill worker
  }
}

// Waiting sequences count as decode load: a worker whose queue is long is not least loaded.
TEST(WorkerRegistryTest, LeastLoadedCountsTheDecodeQueue) {
  WorkerRegistry registry(Model(), WithPolicy(Policy::kLeastLoaded));
  WorkerLoad queued = Running(1);
  queued.set_waiting_sequences(6);
  ASSERT_TRUE(registry.Register(Decode("queued"), queued, kT0).ok());
  ASSERT_TRUE(registry.Register(Decode("steady"), Running(3), kT0).ok());
  absl::StatusOr<Placement> placed = registry.Choose(Prompt(4, 1), /*local=*/true, kT0);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->decode.info.worker_id(), "steady");
}

}  // namespace
}  // namespace estuary::router
