// C7 against real processes (kvtransfer/README.md "Fencing"): a prefill worker stopped with
// SIGSTOP in the middle of a KV push, and woken with SIGCONT after the reservation's lease. The
// decode worker ends the reservation at its lease and gives the pages back at lease + grace (its
// writer attached, then went silent); a request prefilled on the decode worker itself then takes
// those pages, and the stale writer, woken while that request decodes, writes nothing into them:
// the request returns the golden ids. The stopped request fails with a typed status, no process
// crashes, and every page comes back on both workers. Figures are printed ("[figure]").

#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;

constexpr absl::Duration kLease = absl::Milliseconds(1500);
constexpr absl::Duration kGrace = absl::Seconds(1);  // DecodeEngineOptions::lease_grace

// Polls until `pred` holds or `limit` passes; the time it took (or `limit`).
template <typename Pred>
absl::Duration Until(Pred pred, absl::Duration limit) {
  const absl::Time start = absl::Now();
  while (!pred() && absl::Now() - start < limit) absl::SleepFor(absl::Milliseconds(5));
  return absl::Now() - start;
}

TEST(StalledPrefillTest, SigstopDuringTheTransferFreesAtLeasePlusGraceAndNoLateWriteLands) {
  // A's 88-token prompt goes to the prefill worker (in 16-token chunks of 150 ms each, pushed as
  // they are computed); B's 17-token prompt is prefilled by the decode worker itself.
  t::ClusterSpec spec = t::Spec("stories260K", 1, 1, 1, 1, {"--local-prefill-max-tokens", "32"});
  spec.prefill_flags = {"--debug-step-delay", "150ms", "--max-num-batched-tokens", "16"};
  spec.decode_flags = {"--lease-ms", "1500", "--debug-step-delay", "20ms"};
  t::Cluster cluster(spec);
  const std::string decode = cluster.decode(0).address;
  const std::string prefill = cluster.prefill(0).address;
  const int decode_free = t::FreePages(decode, true);
  const int prefill_free = t::FreePages(prefill, false);
  ASSERT_GT(decode_free, 0);
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  const t::GoldenCase& a = cases.back();
  const t::GoldenCase& b = cases[4];
  ASSERT_GT(a.prompt_ids.size(), 32u);
  ASSERT_LE(b.prompt_ids.size(), 32u);

  t::Generated a_result;
  absl::Time a_ended;
  std::thread a_client([&] {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    a_result = t::Generate(cluster.stub(), cluster.Greedy(a.prompt_ids, 50), &context);
    a_ended = absl::Now();
  });
  // The reservation is made when the decode worker's free pages drop; the prompt is in the
  // prefill engine when the prefill worker's drop (its writer attached just before); two steps
  // later the first chunks are pushed: stop it there.
  ASSERT_LT(Until([&] { return t::FreePages(decode, true) < decode_free; }, absl::Seconds(10)),
            absl::Seconds(10));
  const absl::Time reserved = absl::Now();
  ASSERT_LT(Until([&] { return t::FreePages(prefill, false) < prefill_free; }, absl::Seconds(1)),
            absl::Seconds(1));
  absl::SleepFor(absl::Milliseconds(300));
  cluster.prefill(0).process->Signal(SIGSTOP);

  // The lease ends; the pages come back at lease + grace, not before.
  Until([&] { return t::FreePages(decode, true) == decode_free; }, absl::Seconds(10));
  const absl::Duration since_reserve = absl::Now() - reserved;
  std::printf("[figure] C7 prefill stopped mid-push: decode pages back %.0f ms after the "
              "reservation (lease %.0f ms + grace %.0f ms)\n",
              absl::ToDoubleMilliseconds(since_reserve), absl::ToDoubleMilliseconds(kLease),
              absl::ToDoubleMilliseconds(kGrace));
  EXPECT_EQ(t::FreePages(decode, true), decode_free) << "the decode pages did not come back";
  EXPECT_GE(since_reserve, kLease + kGrace - absl::Milliseconds(100)) << "given back too early";
  EXPECT_LE(since_reserve, kLease + kGrace + absl::Seconds(2));

  // B takes the pages A had; the stale writer wakes up while B decodes.
  t::Generated b_result;
  std::thread b_client([&] {
    b_result = t::Generate(cluster.stub(), cluster.Greedy(b.prompt_ids, 60));
  });
  ASSERT_LT(Until([&] { return t::FreePages(decode, true) < decode_free; }, absl::Seconds(10)),
            absl::Seconds(10));
  const absl::Time woken = absl::Now();
  cluster.prefill(0).process->Signal(SIGCONT);
  b_client.join();
  a_client.join();

  ASSERT_TRUE(b_result.status.ok()) << b_result.status.error_message() << "\n" << cluster.Logs();
  EXPECT_EQ(b_result.ids, std::vector<int32_t>(b.completion_ids.begin(),
                                               b.completion_ids.begin() +
                                                   static_cast<long>(b_result.ids.size())));
  EXPECT_EQ(b_result.ids.size(), std::min<size_t>(60, b.completion_ids.size()));
  EXPECT_EQ(a_result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << a_result.status.error_message();
  EXPECT_TRUE(a_result.ids.empty());

  // Nothing leaked, nobody crashed: both workers answer with every page back.
  Until([&] { return t::FreePages(prefill, false) == prefill_free; }, absl::Seconds(5));
  std::printf("[figure] C7 after SIGCONT: request A ended %.0f ms after the wake-up (%s)\n",
              absl::ToDoubleMilliseconds(a_ended - woken),
              a_result.status.error_message().c_str());
  EXPECT_LT(a_ended - woken, absl::Seconds(3));
  EXPECT_EQ(t::FreePages(prefill, false), prefill_free);
  EXPECT_EQ(t::FreePages(decode, true), decode_free);
  // The cluster still serves A's prompt through the (woken) prefill worker.
  const t::Generated again = t::Generate(cluster.stub(), cluster.Greedy(a.prompt_ids, 20));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.ids, std::vector<int32_t>(a.completion_ids.begin(),
                                            a.completion_ids.begin() +
                                                static_cast<long>(again.ids.size())));
}

}  // namespace
}  // namespace estuary
