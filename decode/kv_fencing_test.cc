// Fencing of a reservation's pages against its writer (kvtransfer/README.md "Fencing";
// reliability item C7 in-process): the real decode engine (stories260K), wired to a KvReceiver as
// the decode worker wires it, and KvPushers that push KV the model really computed, over the
// in-process transport (a FaultTransport on the writer's side where a fault is needed). The
// engine is stepped by the test, so every ordering below is deterministic but for the clock.
//
//  - a put tried after the pages went to a new request is never posted: the new owner's KV is
//    untouched (checksums) and it decodes the golden ids;
//  - a put that stalled past the writer's stop lands (the transport does not fence: see README)
//    but is reported, and the new owner recomputes: still the golden ids;
//  - an Abort (the router's) of a reservation with a writer ends the request at once and gives
//    the pages back only on the writer's abort completion; without a writer, at once;
//  - completions of other epochs, other writers, or out-of-range provenance are refused;
//  - a writer holding a descriptor the engine's reservation was not described by is refused at
//    its attach (the descriptor digest), before any put.
// Figures are printed ("[figure]") for README's table.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/model_loader.h"
#include "core/model/paged_kv_view.h"
#include "decode/decode_engine.h"
#include "decode/engine_test_collector.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/fault_transport.h"
#include "kvtransfer/fingerprint.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/kv_pusher.h"
#include "kvtransfer/kv_receiver.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

namespace kv = ::estuary::kvtransfer;
using ::estuary::testing::GoldenCase;

constexpr char kModelId[] = "stories260K";
constexpr absl::Duration kGrace = absl::Milliseconds(200);

DecodeRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt) {
  DecodeRequest r;
  r.request_id = id;
  r.prompt_ids = prompt;
  r.max_tokens = 200;
  r.sampling.temperature = 0.0f;
  return r;
}

estuary::v1::KvFormatFingerprint Fingerprint(const LlamaConfig& c, int block_size) {
  return kv::MakeFingerprint(kModelId, c.n_layers, c.n_kv_heads, c.head_dim, block_size);
}

// The key both workers seal and verify descriptors with (workers derive theirs from the
// cluster token).
const kv::DescriptorSeal& Seal() {
  static const kv::DescriptorSeal* const seal =
      new kv::DescriptorSeal("kv-fencing-test key of 32 bytes!");
  return *seal;
}

// The decode worker: the engine and its receiver, wired as DecodeService wires them (attaches
// checked against what the engine reserved, writers attach through AttachWriter; completions end
// or complete reservations).
struct DecodeSide {
  explicit DecodeSide(const LlamaModel& model) {
    DecodeEngineOptions options;
    options.kv_cache_bytes = int64_t{2} << 20;
    options.lease_grace = kGrace;
    auto e = DecodeEngine::Create(model, nullptr, options, collector.Sink());
    EXPECT_TRUE(e.ok()) << e.status();
    engine = std::move(*e);
    transport = kv::InProcessTransport::Create();
    auto r = kv::KvReceiver::Create(*transport, engine->mutable_pool(),
                                    Fingerprint(model.config(), options.block_size), Seal());
    EXPECT_TRUE(r.ok()) << r.status();
    receiver = std::move(*r);
    kv::KvReceiverCallbacks callbacks;
    callbacks.issued = [this](const std::string& id,
                              uint64_t epoch) -> absl::StatusOr<kv::IssuedReservation> {
      absl::StatusOr<DecodeEngine::Reservation> r = engine->FindReservation(id, epoch);
      if (!r.ok()) return r.status();
      return kv::IssuedReservation{r->pages, r->lease_deadline};
    };
    callbacks.on_attach = [this](const estuary::v1::KvAttach& a, uint64_t writer) {
      return engine->AttachWriter(a.request_id(), {a.reservation_epoch(), writer});
    };
    callbacks.on_completion = [this](const estuary::v1::KvCompletion& c, uint64_t writer) {
      const DecodeEngine::Writer w{c.reservation_epoch(), writer, c.late_put()};
      if (c.status_code() != 0) {
        (void)engine->EndReservation(c.request_id(), w,
                                     absl::Status(static_cast<absl::StatusCode>(c.status_code()),
                                                  c.status_message()));
      } else {
        (void)engine->CompleteReservation(
            c.request_id(), w, c.first_token(),
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.provenance().data()),
                                c.provenance().size()));
      }
      completions.fetch_add(1);
    };
    EXPECT_TRUE(receiver->Start(std::move(callbacks)).ok());
    baseline = FreePages();
  }
  ~DecodeSide() { receiver->Stop(); }

  int FreePages() const { return engine->pool().free_pages() + engine->pool().cached_pages(); }
  estuary::v1::TransferDescriptor Reserve(const std::string& id, const std::vector<int32_t>& prompt,
                                          absl::Duration lease,
                                          DecodeEngine::Reservation* out = nullptr) {
    auto r = engine->Reserve(Greedy(id, prompt), lease);
    EXPECT_TRUE(r.ok()) << r.status();
    if (out != nullptr) *out = *r;
    return receiver->Describe(id, r->pages, r->lease_deadline, r->epoch);
  }
  // Steps until `done()` holds or `limit` passes; whether it held.
  bool StepUntil(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(10)) {
    const absl::Time end = absl::Now() + limit;
    while (!done()) {
      if (absl::Now() > end) return false;
      EXPECT_TRUE(engine->Step().ok());
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }
  bool Finished(const std::string& id) const { return collector.final_events.count(id) > 0; }
  absl::StatusCode FinalCode(const std::string& id) const {
    return collector.final_events.at(id).status.code();
  }
  // FNV-1a over every layer of `pages` (K and V of every head, whole pages).
  uint64_t Checksum(const std::vector<int32_t>& pages) const {
    uint64_t h = 1469598103934665603ull;
    const KvPool& pool = engine->pool();
    for (int l = 0; l < pool.layout().n_layers; ++l) {
      for (int32_t page : pages) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(pool.k(l, page, 0));
        for (int64_t i = 0; i < pool.page_bytes_per_layer(); ++i) {
          h = (h ^ bytes[i]) * 1099511628211ull;
        }
      }
    }
    return h;
  }

  TokenCollector collector;  // engine thread = the test thread
  std::unique_ptr<DecodeEngine> engine;
  std::unique_ptr<kv::Transport> transport;
  std::unique_ptr<kv::KvReceiver> receiver;
  std::atomic<int> completions{0};
  int baseline = 0;
};

// The prefill worker: the prompt's KV computed by the model in its own pool, pushed from there.
struct PrefillSide {
  PrefillSide(const LlamaModel& model, const KvLayout& layout, const std::vector<int32_t>& prompt,
              const kv::FaultConfig& faults = {})
      : config(model.config()),
        transport(kv::InProcessTransport::Create(), faults),
        cache(transport),
        replies(transport),
        prompt_len(static_cast<int>(prompt.size())) {
    auto p = KvPool::Create(layout, int64_t{2} << 20);
    EXPECT_TRUE(p.ok()) << p.status();
    pool = std::move(*p);
    kv = std::make_unique<SequenceKv>(pool.get());
    EXPECT_TRUE(kv->Reserve(prompt_len).ok());
    PagedKvView view(kv.get());
    std::vector<float> logits(static_cast<size_t>(config.vocab_size));
    EXPECT_TRUE(model.Forward(prompt, 0, view, absl::MakeSpan(logits)).ok());
    first_token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                       logits.begin());
  }
  // Overwrites the computed KV with `value` everywhere: what a stale writer's bytes look like to
  // the pages' new owner (nothing it could attend to sensibly).
  void Scramble(float value) {
    for (int l = 0; l < pool->layout().n_layers; ++l) {
      const KvRegion r = pool->layer_region(l);
      std::fill_n(static_cast<float*>(r.data), r.bytes / sizeof(float), value);
    }
  }
  absl::StatusOr<std::unique_ptr<kv::KvPusher>> Pusher(
      const estuary::v1::TransferDescriptor& d) {
    return kv::KvPusher::Create(transport, cache, replies, *pool, d, Seal(),
                                Fingerprint(config, pool->layout().block_size), prompt_len,
                                absl::Now() + absl::Seconds(10));
  }
  absl::Status Push(kv::KvPusher& pusher, int layer_begin, int layer_end) {
    for (int l = layer_begin; l < layer_end; ++l) {
      ESTUARY_RETURN_IF_ERROR(pusher.PushLayer(0, l, 0, prompt_len, kv->pages(), 0));
    }
    return absl::OkStatus();
  }
  absl::Status PushAndComplete(kv::KvPusher& pusher) {
    ESTUARY_RETURN_IF_ERROR(Push(pusher, 0, config.n_layers));
    const std::vector<uint8_t> provenance(static_cast<size_t>(prompt_len), kProvenanceFullDepth);
    return pusher.Complete(first_token, provenance, prompt_len);
  }

  const LlamaConfig config;
  kv::FaultTransport transport;
  kv::EndpointCache cache;
  kv::AttachReplies replies;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<SequenceKv> kv;
  const int prompt_len;
  int32_t first_token = 0;
};

bool Overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (int32_t p : a) {
    if (std::find(b.begin(), b.end(), p) != b.end()) return true;
  }
  return false;
}

class KvFencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadModel(::estuary::testing::GoldenModelDir(kModelId));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(loaded->model);
    const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases(kModelId);
    ASSERT_FALSE(cases.empty());
    golden_ = cases.back();
  }

  // A: reserved under a short lease, its writer attached, one layer pushed, then silent; its lease
  // ends and, lease + grace later, its pages go to B, whose writer pushes the real KV. Returns
  // once B's KV is complete (not yet decoded). `a_writer` keeps A's pusher for the test.
  void LeaseLapsesAndPagesGoToB(DecodeSide& decode, PrefillSide& a_side,
                                std::unique_ptr<kv::KvPusher>* a_writer,
                                DecodeEngine::Reservation* b) {
    DecodeEngine::Reservation a;
    const absl::Duration lease = kv::KvPusher::kLeaseSkewMargin + absl::Milliseconds(500);
    auto pusher = a_side.Pusher(decode.Reserve("A", golden_.prompt_ids, lease, &a));
    ASSERT_TRUE(pusher.ok()) << pusher.status();
    ASSERT_TRUE(a_side.Push(**pusher, 0, 1).ok());
    *a_writer = std::move(*pusher);

    // The lease ends: A fails at once, its pages stay fenced until lease + grace.
    ASSERT_TRUE(decode.StepUntil([&] { return decode.Finished("A"); }));
    EXPECT_EQ(decode.FinalCode("A"), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(decode.engine->fenced(), 1);
    EXPECT_LT(decode.FreePages(), decode.baseline);
    ASSERT_TRUE(decode.StepUntil([&] { return decode.FreePages() == decode.baseline; }));
    const absl::Duration after_lease = absl::Now() - a.lease_deadline;
    std::printf("[figure] fenced pages back %.0f ms after the lease (grace %.0f ms, no word from "
                "the writer)\n",
                absl::ToDoubleMilliseconds(after_lease), absl::ToDoubleMilliseconds(kGrace));
    EXPECT_GE(after_lease, kGrace);
    EXPECT_EQ(decode.engine->fenced(), 0);

    // B takes the same pages (the pool hands out the last freed first) and gets its real KV.
    PrefillSide b_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
    auto b_pusher = b_side.Pusher(decode.Reserve("B", golden_.prompt_ids, absl::Seconds(30), b));
    ASSERT_TRUE(b_pusher.ok()) << b_pusher.status();
    ASSERT_TRUE(Overlap(a.pages, b->pages));
    ASSERT_TRUE(b_side.PushAndComplete(**b_pusher).ok());
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (decode.engine->reserved() > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_EQ(decode.engine->reserved(), 0) << "B's completion did not arrive";
  }

  std::unique_ptr<LlamaModel> model_;
  GoldenCase golden_;
};

// The writer stops at its write deadline: a put it tries after the pages went to B is never
// posted, B's KV stays byte for byte what B's writer wrote, and B decodes the golden ids.
TEST_F(KvFencingTest, ALatePutAfterThePagesWentToANewOwnerIsNeverPosted) {
  DecodeSide decode(*model_);
  PrefillSide a_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
  a_side.Scramble(1e3f);
  std::unique_ptr<kv::KvPusher> a_writer;
  DecodeEngine::Reservation b;
  ASSERT_NO_FATAL_FAILURE(LeaseLapsesAndPagesGoToB(decode, a_side, &a_writer, &b));
  const uint64_t before = decode.Checksum(b.pages);

  const int64_t puts = a_writer->puts();
  const absl::Status late = a_side.Push(*a_writer, 1, a_side.config.n_layers);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_EQ(a_writer->puts(), puts);
  const int seen = decode.completions.load();
  ASSERT_TRUE(a_writer->Abort(late).ok());  // A's writer confirms, far too late: ignored
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (decode.completions.load() == seen && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(decode.Checksum(b.pages), before) << "a late put landed in B's pages";
  EXPECT_EQ(decode.engine->stale_writer_reports(), 0);

  ASSERT_TRUE(decode.engine->RunUntilIdle(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(decode.collector.tokens["B"], golden_.completion_ids);
  EXPECT_EQ(decode.FreePages(), decode.baseline);
}

// A writer stalled between its deadline check and the post (a SIGSTOP at the worst moment):
// its put lands in B's pages, since the in-process transport, like UCX tcp and sm, does not
// fence registered memory (README "Fencing"). The writer reports the late put with its abort,
// the engine recomputes whoever holds those pages, and B still decodes the golden ids.
TEST_F(KvFencingTest, AStalledLatePutIsReportedAndTheNewOwnerRecomputes) {
  DecodeSide decode(*model_);
  PrefillSide a_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids,
                     {.put_delay = absl::Milliseconds(2500), .stall_puts = true});
  a_side.Scramble(1e3f);
  // A's writer starts its puts in time; the first stalls 2.5 s inside the transport, then goes
  // out (the next one is refused: the write deadline has passed).
  std::unique_ptr<kv::KvPusher> a_writer;
  DecodeEngine::Reservation a;
  const absl::Duration lease = kv::KvPusher::kLeaseSkewMargin + absl::Milliseconds(500);
  auto pusher = a_side.Pusher(decode.Reserve("A", golden_.prompt_ids, lease, &a));
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  a_writer = std::move(*pusher);
  absl::Status stalled;
  std::thread writer([&] { stalled = a_side.Push(*a_writer, 1, 2); });

  ASSERT_TRUE(decode.StepUntil([&] { return decode.FreePages() == decode.baseline; }));
  PrefillSide b_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
  DecodeEngine::Reservation b;
  auto b_pusher = b_side.Pusher(decode.Reserve("B", golden_.prompt_ids, absl::Seconds(30), &b));
  ASSERT_TRUE(b_pusher.ok()) << b_pusher.status();
  ASSERT_TRUE(Overlap(a.pages, b.pages));
  ASSERT_TRUE(b_side.PushAndComplete(**b_pusher).ok());
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (decode.engine->reserved() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  const uint64_t before = decode.Checksum(b.pages);

  writer.join();  // the stalled put went out after A's write deadline
  EXPECT_EQ(stalled.code(), absl::StatusCode::kDeadlineExceeded) << stalled;
  EXPECT_EQ(a_writer->puts(), 1);
  EXPECT_TRUE(a_writer->late_put());
  EXPECT_NE(decode.Checksum(b.pages), before) << "the stalled put should have landed (no fence "
                                                 "in the transport); if it did not, README's "
                                                 "'Fencing' table is out of date";
  const int seen = decode.completions.load();
  ASSERT_TRUE(a_writer->Abort(absl::DeadlineExceededError("lease")).ok());
  while (decode.completions.load() == seen && absl::Now() < until + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(decode.engine->stale_writer_reports(), 1);

  ASSERT_TRUE(decode.engine->RunUntilIdle(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(decode.collector.tokens["B"], golden_.completion_ids);
  EXPECT_EQ(decode.FreePages(), decode.baseline);
}

// The router's Abort while the writer is still pushing: the request ends at once, the pages
// stay fenced (a new reservation cannot have them) until the writer's abort completion.
TEST_F(KvFencingTest, AnAbortKeepsThePagesUntilTheWritersAbortCompletion) {
  DecodeSide decode(*model_);
  PrefillSide a_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
  DecodeEngine::Reservation a;
  auto pusher = a_side.Pusher(decode.Reserve("A", golden_.prompt_ids, absl::Seconds(30), &a));
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  ASSERT_TRUE(a_side.Push(**pusher, 0, 1).ok());

  const absl::Time aborted = absl::Now();
  EXPECT_TRUE(decode.engine->Abort("A"));
  ASSERT_TRUE(decode.StepUntil([&] { return decode.Finished("A"); }));
  const absl::Duration ended = absl::Now() - aborted;
  EXPECT_EQ(decode.FinalCode("A"), absl::StatusCode::kCancelled);
  EXPECT_EQ(decode.engine->fenced(), 1);
  // The writer goes on a little (its puts land in A's own, fenced pages), then confirms.
  ASSERT_TRUE(a_side.Push(**pusher, 1, 2).ok());
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(decode.engine->Step().ok());
  EXPECT_LT(decode.FreePages(), decode.baseline) << "pages given back before the writer stopped";

  const absl::Time confirmed = absl::Now();
  ASSERT_TRUE((*pusher)->Abort(absl::CancelledError("the router aborted")).ok());
  ASSERT_TRUE(decode.StepUntil([&] { return decode.FreePages() == decode.baseline; },
                               absl::Seconds(5)));
  const absl::Duration back = absl::Now() - confirmed;
  std::printf("[figure] Abort with a writer: request ended in %.1f ms; pages back %.1f ms after "
              "the writer's abort completion was sent\n",
              absl::ToDoubleMilliseconds(ended), absl::ToDoubleMilliseconds(back));
  EXPECT_LT(ended, absl::Seconds(1));
  EXPECT_LT(back, absl::Seconds(1));
  EXPECT_EQ(decode.engine->fenced(), 0);
}

// An Abort before any writer attached: the pages return at once, and a writer that comes later
// is refused before it can post a single put.
TEST_F(KvFencingTest, AnAbortBeforeAnyWriterReturnsThePagesAtOnceAndRefusesTheWriter) {
  DecodeSide decode(*model_);
  PrefillSide a_side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
  const estuary::v1::TransferDescriptor d =
      decode.Reserve("A", golden_.prompt_ids, absl::Seconds(30));
  EXPECT_TRUE(decode.engine->Abort("A"));
  ASSERT_TRUE(decode.engine->Step().ok());
  EXPECT_EQ(decode.FinalCode("A"), absl::StatusCode::kCancelled);
  EXPECT_EQ(decode.FreePages(), decode.baseline);
  EXPECT_EQ(decode.engine->fenced(), 0);
  auto pusher = a_side.Pusher(d);
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const absl::Status refused = a_side.Push(**pusher, 0, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_EQ((*pusher)->puts(), 0);
}

// A writer whose descriptor differs from the one the engine's reservation was described by
// (its pages, regions or lease; here sealed again with the cluster's key, as a worker with a bug
// or a peer holding the key could) is refused at its attach: no put is posted, the reservation
// stays open for its real writer, and the pages of the other reservation are untouched.
TEST_F(KvFencingTest, AWriterHoldingADescriptorTheEngineDidNotIssueIsRefused) {
  DecodeSide decode(*model_);
  PrefillSide side(*model_, decode.engine->pool().layout(), golden_.prompt_ids);
  DecodeEngine::Reservation other;
  (void)decode.Reserve("other", golden_.prompt_ids, absl::Seconds(30), &other);
  const uint64_t before = decode.Checksum(other.pages);
  estuary::v1::TransferDescriptor d = decode.Reserve("A", golden_.prompt_ids, absl::Seconds(30));
  // A's descriptor pointed at the other reservation's pages.
  for (int i = 0; i < d.page_ids_size() && i < static_cast<int>(other.pages.size()); ++i) {
    d.set_page_ids(i, other.pages[static_cast<size_t>(i)]);
  }
  Seal().Seal(&d);
  auto pusher = side.Pusher(d);
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const absl::Status refused = side.Push(**pusher, 0, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("did not issue"));
  EXPECT_EQ((*pusher)->puts(), 0);
  EXPECT_EQ(decode.Checksum(other.pages), before);
  EXPECT_EQ(decode.engine->reserved(), 2);  // A still waits for a writer with its descriptor
  (void)(*pusher)->Abort(refused);
}

// What a writer says is checked against the engine's own reservation: the epoch (a reused
// request id does not let the old writer complete the new reservation), the writer's identity,
// and the provenance (length and values).
TEST_F(KvFencingTest, CompletionsAreCheckedAgainstTheReservation) {
  DecodeSide decode(*model_);
  DecodeEngine& engine = *decode.engine;
  const std::vector<int32_t>& prompt = golden_.prompt_ids;
  auto first = engine.Reserve(Greedy("reused", prompt), absl::Seconds(30));
  ASSERT_TRUE(first.ok());
  const DecodeEngine::Writer old_writer{first->epoch, 11};
  ASSERT_TRUE(engine.AttachWriter("reused", old_writer).ok());
  EXPECT_EQ(engine.AttachWriter("reused", {first->epoch, 12}).code(),
            absl::StatusCode::kFailedPrecondition);  // one writer per reservation
  EXPECT_TRUE(engine.Abort("reused"));
  ASSERT_TRUE(engine.Step().ok());  // ended, fenced for its writer
  auto second = engine.Reserve(Greedy("reused", prompt), absl::Seconds(30));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->epoch, first->epoch);
  const std::vector<uint8_t> full(prompt.size(), kProvenanceFullDepth);
  // The old writer's completion names the old epoch: not the live reservation's.
  EXPECT_EQ(engine.CompleteReservation("reused", old_writer, 5, full).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine.reserved(), 1);
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.fenced(), 0);  // ... but it confirmed the old one: its pages went back
  const DecodeEngine::Writer writer{second->epoch, 21};
  EXPECT_EQ(engine.AttachWriter("reused", {second->epoch + 1, 21}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.AttachWriter("reused", writer).ok());
  EXPECT_EQ(engine.CompleteReservation("reused", {second->epoch, 22}, 5, full).code(),
            absl::StatusCode::kFailedPrecondition);  // not the attached writer
  std::vector<uint8_t> bad = full;
  bad[0] = static_cast<uint8_t>(model_->config().n_layers);  // no such layer
  EXPECT_EQ(engine.CompleteReservation("reused", writer, 5, bad).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine.Step().ok());  // the request ends with that error; the writer was done
  EXPECT_EQ(decode.FinalCode("reused"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.reserved(), 0);
  EXPECT_EQ(decode.FreePages(), decode.baseline);
}

}  // namespace
}  // namespace estuary
