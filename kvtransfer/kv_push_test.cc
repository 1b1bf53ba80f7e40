// The push protocol end to end: KvPusher (prefill pool, src TP) -> Transport -> KvReceiver
// (decode pool, dst TP), byte-exact after head re-sharding, plus fingerprint / descriptor checks,
// the control codec's bounds, faults (dropped, delayed, corrupted completions; an endpoint
// failing mid-push; a dead peer) and the writer's fencing (README "Fencing": no put before the
// attach was accepted, none after the write deadline, a stalled put reported late) and sealed
// descriptors (README "Sealed descriptors": a missing, wrong or stale seal refused before any
// connect; without a key, an altered descriptor's attach refused by the decode side).

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kvtransfer/descriptor_check.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/fault_transport.h"
#include "kvtransfer/kv_control_codec.h"
#include "kvtransfer/fingerprint.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/kv_pusher.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/ucx_transport.h"

namespace estuary::kvtransfer {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr int kHeads = 4;  // whole-model KV heads
constexpr int kHeadDim = 4;
constexpr int kBlock = 16;
constexpr int kPrompt = 37;  // 2 full pages + 5 slots
constexpr float kSrcJunk = -3.0f;  // prefill slots past the prompt
constexpr float kDstFill = -7.0f;  // decode memory before the push

absl::Time In(absl::Duration d) { return absl::Now() + d; }

estuary::v1::KvFormatFingerprint Fingerprint(const std::string& model = "test-model") {
  return MakeFingerprint(model, kLayers, kHeads, kHeadDim, kBlock);
}

// Exact in f32: a function of (layer, position, whole-model head, K/V, dim).
float Value(int layer, int pos, int head, int kv, int dim) {
  return static_cast<float>(((((layer * 64 + pos) * 8 + head) * 2 + kv) * 8 + dim) + 1);
}

std::unique_ptr<KvPool> MakePool(int tp, int pages) {
  KvLayout layout{kLayers, kHeads / tp, kHeadDim, kBlock};
  auto pool = KvPool::Create(layout, layout.page_bytes() * tp * pages, tp);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// Writes Value(...) for positions < kPrompt and kSrcJunk past it, on every shard.
void FillSource(KvPool& pool, const std::vector<int32_t>& pages) {
  const int tp = pool.num_shards();
  const int hs = pool.layout().n_kv_heads;
  for (int s = 0; s < tp; ++s) {
    for (int l = 0; l < kLayers; ++l) {
      for (size_t i = 0; i < pages.size(); ++i) {
        for (int h = 0; h < hs; ++h) {
          for (int kv = 0; kv < 2; ++kv) {
            float* p = kv == 0 ? pool.k(l, pages[i], h, s) : pool.v(l, pages[i], h, s);
            for (int slot = 0; slot < kBlock; ++slot) {
              const int pos = static_cast<int>(i) * kBlock + slot;
              for (int d = 0; d < kHeadDim; ++d) {
                p[slot * kHeadDim + d] = pos < kPrompt ? Value(l, pos, s * hs + h, kv, d) : kSrcJunk;
              }
            }
          }
        }
      }
    }
  }
}

void FillAll(KvPool& pool, float value) {
  for (int s = 0; s < pool.num_shards(); ++s) {
    for (int l = 0; l < kLayers; ++l) {
      KvRegion r = pool.layer_region(l, s);
      std::fill_n(static_cast<float*>(r.data), r.bytes / sizeof(float), value);
    }
  }
}

// Every destination float: the source value of the same (layer, position, whole-model head) for
// positions < kPrompt; untouched (kDstFill) past the prompt and in pages not pushed to.
int CountMismatches(const KvPool& pool, const std::vector<int32_t>& pages, int pushed_tokens) {
  int bad = 0;
  const int tp = pool.num_shards();
  const int hd = pool.layout().n_kv_heads;
  for (int s = 0; s < tp; ++s) {
    for (int l = 0; l < kLayers; ++l) {
      for (size_t i = 0; i < pages.size(); ++i) {
        for (int h = 0; h < hd; ++h) {
          for (int kv = 0; kv < 2; ++kv) {
            const float* p = kv == 0 ? pool.k(l, pages[i], h, s) : pool.v(l, pages[i], h, s);
            for (int slot = 0; slot < kBlock; ++slot) {
              const int pos = static_cast<int>(i) * kBlock + slot;
              for (int d = 0; d < kHeadDim; ++d) {
                const float want =
                    pos < pushed_tokens ? Value(l, pos, s * hd + h, kv, d) : kDstFill;
                if (p[slot * kHeadDim + d] != want && ++bad <= 5) {
                  ADD_FAILURE() << "shard " << s << " layer " << l << " page#" << i << " head "
                                << h << " kv " << kv << " slot " << slot << " dim " << d
                                << ": got " << p[slot * kHeadDim + d] << " want " << want;
                }
              }
            }
          }
        }
      }
    }
  }
  return bad;
}

// Completions seen by the receiver's callback.
class Inbox {
 public:
  void Add(const estuary::v1::KvCompletion& c) {
    absl::MutexLock lock(&mu_);
    got_.push_back(c);
  }
  std::optional<estuary::v1::KvCompletion> Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::vector<estuary::v1::KvCompletion>* g) { return !g->empty(); },
                             &got_),
                         timeout);
    if (got_.empty()) return std::nullopt;
    estuary::v1::KvCompletion c = got_.front();
    got_.erase(got_.begin());
    return c;
  }

 private:
  absl::Mutex mu_;
  std::vector<estuary::v1::KvCompletion> got_ ABSL_GUARDED_BY(mu_);
};

// LayerReady-style calls: for each chunk, every rank (own thread) pushes every layer.
absl::Status PushPrompt(KvPusher& pusher, int src_tp, const std::vector<int32_t>& local_pages,
                        int chunk) {
  for (int c0 = 0; c0 < kPrompt; c0 += chunk) {
    const int c1 = std::min(kPrompt, c0 + chunk);
    const int fp = c0 / kBlock;
    const int ep = (c1 + kBlock - 1) / kBlock;
    std::vector<absl::Status> status(static_cast<size_t>(src_tp));
    std::vector<std::thread> ranks;
    for (int r = 0; r < src_tp; ++r) {
      ranks.emplace_back([&, r] {
        for (int l = 0; l < kLayers; ++l) {
          absl::Status s = pusher.PushLayer(
              r, l, c0, c1, absl::MakeConstSpan(local_pages).subspan(fp, ep - fp), fp);
          if (!s.ok()) {
            status[static_cast<size_t>(r)] = s;
            return;
          }
        }
      });
    }
    for (std::thread& t : ranks) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

std::vector<uint8_t> Provenance() {
  std::vector<uint8_t> p(kPrompt, kProvenanceFullDepth);
  for (int i = 0; i < kPrompt; i += 3) p[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 7);
  return p;
}

// The cluster's descriptor key in these tests (a worker derives its own from the cluster token).
const DescriptorSeal& TestSeal() {
  static const DescriptorSeal* const seal = new DescriptorSeal("kv-push-test key, 32 bytes long!");
  return *seal;
}

// The two workers: a prefill pool (src_tp shards) and a decode pool (dst_tp shards) with a
// receiver on `decode_transport`, which lets every writer attach except to requests in `refuse`
// (and, as a decode worker does, only with the digest of a descriptor it issued). Descriptors
// are sealed with `seal` (TestSeal(), or DescriptorSeal::None()). One World per prefill transport
// at a time (its AttachReplies reads that transport's inbox).
struct World {
  World(Transport& prefill_transport, Transport& decode_transport, int src_tp, int dst_tp,
        DescriptorSeal descriptor_seal = TestSeal())
      : seal(std::move(descriptor_seal)),
        prefill(MakePool(src_tp, 8)),
        decode(MakePool(dst_tp, 8)),
        cache(prefill_transport),
        replies(prefill_transport) {
    local_pages = *prefill->Allocate(3);
    auto taken = decode->Allocate(2);  // so destination ids differ from source ids
    remote_pages = *decode->Allocate(4);
    std::reverse(remote_pages.begin(), remote_pages.end());  // and are not in order
    FillAll(*prefill, kSrcJunk);
    FillSource(*prefill, local_pages);
    FillAll(*decode, kDstFill);
    auto r = KvReceiver::Create(decode_transport, *decode, Fingerprint(), seal);
    EXPECT_TRUE(r.ok()) << r.status();
    receiver = std::move(*r);
    KvReceiverCallbacks callbacks;
    callbacks.issued = [this](const std::string& id,
                              uint64_t epoch) -> absl::StatusOr<IssuedReservation> {
      absl::MutexLock lock(&mu);
      auto it = issued.find({id, epoch});
      if (it == issued.end()) return absl::NotFoundError("no such reservation");
      return it->second;
    };
    callbacks.on_attach = [this](const estuary::v1::KvAttach& a, uint64_t writer) {
      absl::MutexLock lock(&mu);
      if (refuse.contains(a.request_id())) return absl::FailedPreconditionError("refused");
      return absl::OkStatus();
    };
    callbacks.on_completion = [this](const estuary::v1::KvCompletion& c, uint64_t) {
      inbox.Add(c);
    };
    EXPECT_TRUE(receiver->Start(std::move(callbacks)).ok());
  }

  estuary::v1::TransferDescriptor Describe(const std::string& request_id,
                                           absl::Duration lease = absl::Seconds(30)) {
    const absl::Time lease_deadline = In(lease);
    absl::MutexLock lock(&mu);
    issued[{request_id, ++epochs}] = IssuedReservation{remote_pages, lease_deadline};
    return receiver->Describe(request_id, remote_pages, lease_deadline, epochs);
  }
  absl::StatusOr<std::unique_ptr<KvPusher>> Pusher(Transport& prefill_transport,
                                                   const std::string& request_id,
                                                   absl::Duration timeout = absl::Seconds(10),
                                                   absl::Duration lease = absl::Seconds(30)) {
    return Pusher(prefill_transport, Describe(request_id, lease), timeout);
  }
  absl::StatusOr<std::unique_ptr<KvPusher>> Pusher(
      Transport& prefill_transport, const estuary::v1::TransferDescriptor& descriptor,
      absl::Duration timeout = absl::Seconds(10)) {
    return KvPusher::Create(prefill_transport, cache, replies, *prefill, descriptor, seal,
                            Fingerprint(), kPrompt, In(timeout));
  }

  const DescriptorSeal seal;
  std::unique_ptr<KvPool> prefill, decode;
  std::vector<int32_t> local_pages, remote_pages;
  EndpointCache cache;
  AttachReplies replies;
  Inbox inbox;
  absl::Mutex mu;
  absl::flat_hash_set<std::string> refuse ABSL_GUARDED_BY(mu);
  // What Describe issued, by (request id, epoch).
  absl::flat_hash_map<std::pair<std::string, uint64_t>, IssuedReservation> issued
      ABSL_GUARDED_BY(mu);
  uint64_t epochs ABSL_GUARDED_BY(mu) = 0;
  std::unique_ptr<KvReceiver> receiver;  // last: stops before the rest goes
};

// Faults on KV completions only (the attach and its reply go through).
bool IsCompletion(std::string_view payload) {
  return PeekKvControlKind(payload) == KvControlKind::kCompletion;
}

void RoundTrip(Transport& prefill_transport, Transport& decode_transport, int src_tp, int dst_tp,
               int chunk) {
  World w(prefill_transport, decode_transport, src_tp, dst_tp);
  auto pusher = w.Pusher(prefill_transport, "req-1");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  EXPECT_EQ((*pusher)->src_tp(), src_tp);
  EXPECT_EQ((*pusher)->dst_tp(), dst_tp);
  ASSERT_TRUE(PushPrompt(**pusher, src_tp, w.local_pages, chunk).ok());
  const std::vector<uint8_t> provenance = Provenance();
  ASSERT_TRUE((*pusher)->Complete(42, provenance, kPrompt).ok());
  std::optional<estuary::v1::KvCompletion> c = w.inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request_id(), "req-1");
  EXPECT_EQ(c->status_code(), 0);
  EXPECT_EQ(c->first_token(), 42);
  EXPECT_EQ(c->num_tokens(), kPrompt);
  EXPECT_EQ(c->provenance(), std::string(provenance.begin(), provenance.end()));
  EXPECT_EQ(CountMismatches(*w.decode, w.remote_pages, kPrompt), 0);
  // After Complete, the pusher refuses more work.
  EXPECT_EQ((*pusher)->PushLayer(0, 0, 0, 1, absl::MakeConstSpan(w.local_pages).subspan(0, 1), 0)
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

struct Param {
  int src_tp, dst_tp, chunk;
};

class KvPushTpTest : public ::testing::TestWithParam<Param> {};

TEST_P(KvPushTpTest, InProcessRoundTripIsByteExact) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  RoundTrip(*prefill, *decode, GetParam().src_tp, GetParam().dst_tp, GetParam().chunk);
}

INSTANTIATE_TEST_SUITE_P(
    All, KvPushTpTest,
    ::testing::Values(Param{1, 1, 16}, Param{1, 2, 16}, Param{2, 1, 16}, Param{2, 2, 16},
                      // chunks ending mid-page: two chunks write disjoint slots of one page
                      Param{1, 2, 10}, Param{2, 1, 10}, Param{2, 2, 7}),
    [](const ::testing::TestParamInfo<Param>& info) {
      return "src" + std::to_string(info.param.src_tp) + "_dst" +
             std::to_string(info.param.dst_tp) + "_chunk" + std::to_string(info.param.chunk);
    });

// Two UCX workers over tcp in this process: the prefill side and the decode side.
struct UcxTcpPair {
  std::unique_ptr<UcxTransport> prefill;
  std::unique_ptr<UcxTransport> decode;
};
UcxTcpPair MakeUcxTcpPair() {
  UcxTransportOptions options;
  options.tls = "tcp";
  auto prefill = UcxTransport::Create(options);
  auto decode = UcxTransport::Create(options);
  EXPECT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_TRUE(decode.ok()) << decode.status();
  if (!prefill.ok() || !decode.ok()) return {};
  return {std::move(*prefill), std::move(*decode)};
}

class KvPushUcxTest : public ::testing::TestWithParam<int> {};

// Over UCX (tcp, two workers in this process), prefill TP 2 -> decode TP 1; chunk 7 makes chunks
// share pages, which UCX would not order without the disjoint-slot puts.
TEST_P(KvPushUcxTest, TcpTp2ToTp1) {
  UcxTcpPair ucx = MakeUcxTcpPair();
  ASSERT_TRUE(ucx.prefill && ucx.decode);
  RoundTrip(*ucx.prefill, *ucx.decode, 2, 1, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Chunks, KvPushUcxTest, ::testing::Values(16, 7));

// What the attach costs over UCX tcp when nothing overlaps it: the first PushLayer of a request
// waits for the decode worker's answer (sent right after Create); the second does not. Endpoints
// are cached after the first request, as in a worker.
TEST(KvPushUcxAttachTest, TheAttachRoundTripIsSmall) {
  UcxTcpPair ucx = MakeUcxTcpPair();
  ASSERT_TRUE(ucx.prefill && ucx.decode);
  World w(*ucx.prefill, *ucx.decode, 1, 1);
  const auto pages = absl::MakeConstSpan(w.local_pages).subspan(0, 1);
  std::vector<double> first_us, second_us;
  for (int i = 0; i < 21; ++i) {
    auto pusher = w.Pusher(*ucx.prefill, absl::StrCat("attach-", i));
    ASSERT_TRUE(pusher.ok()) << pusher.status();
    absl::Time start = absl::Now();
    ASSERT_TRUE((*pusher)->PushLayer(0, 0, 0, kBlock, pages, 0).ok());
    const double first = absl::ToDoubleMicroseconds(absl::Now() - start);
    start = absl::Now();
    ASSERT_TRUE((*pusher)->PushLayer(0, 1, 0, kBlock, pages, 0).ok());
    const double second = absl::ToDoubleMicroseconds(absl::Now() - start);
    if (i > 0) {  // the first request also connected both ways
      first_us.push_back(first);
      second_us.push_back(second);
    }
    ASSERT_TRUE((*pusher)->Abort(absl::CancelledError("done")).ok());
  }
  std::sort(first_us.begin(), first_us.end());
  std::sort(second_us.begin(), second_us.end());
  std::printf("[figure] ucx tcp: first PushLayer (waits for the attach answer) median %.0f us, "
              "a later one %.0f us\n",
              first_us[first_us.size() / 2], second_us[second_us.size() / 2]);
  EXPECT_LT(first_us[first_us.size() / 2], 50000);  // well under a prefill step on any machine
}

TEST(KvPushTest, FingerprintMismatchIsRefusedNamingBoth) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 1, 1);
  auto pusher = KvPusher::Create(*prefill, w.cache, w.replies, *w.prefill, w.Describe("r"),
                                 w.seal, Fingerprint("other-model"), kPrompt,
                                 In(absl::Seconds(5)));
  ASSERT_FALSE(pusher.ok());
  EXPECT_EQ(pusher.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pusher.status().message(), HasSubstr("model=other-model"));
  EXPECT_THAT(pusher.status().message(), HasSubstr("model=test-model"));
  EXPECT_EQ(w.cache.connects(), 0);  // refused before connecting
}

TEST(KvPushTest, BadDescriptorsAreRefused) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 2, 1);
  const auto good = w.Describe("r");
  // Each bad descriptor sealed again: what the checks behind the seal refuse (a decode worker's
  // own mistakes, or one with the key).
  auto create = [&](estuary::v1::TransferDescriptor d, int tokens = kPrompt) {
    w.seal.Seal(&d);
    return KvPusher::Create(*prefill, w.cache, w.replies, *w.prefill, d, w.seal, Fingerprint(),
                            tokens, In(absl::Seconds(5)))
        .status();
  };
  ASSERT_TRUE(create(good).ok());
  const int64_t connects = w.cache.connects();
  auto d = good;
  d.mutable_layout()->set_block_size(8);
  EXPECT_THAT(create(d).message(), HasSubstr("block_size"));
  d = good;
  d.mutable_layout()->set_n_kv_heads(3);
  EXPECT_THAT(create(d).message(), HasSubstr("n_kv_heads"));
  d = good;
  d.clear_page_ids();
  d.add_page_ids(1);
  d.add_page_ids(2);
  EXPECT_THAT(create(d).message(), HasSubstr("2 page ids for a prompt of 37"));
  d = good;
  d.set_page_ids(0, 1000);
  EXPECT_THAT(create(d).message(), HasSubstr("too few for page 1000"));
  d = good;
  d.set_transport("ucx");
  EXPECT_EQ(create(d).code(), absl::StatusCode::kInvalidArgument);
  d = good;
  d.mutable_ranks(0)->mutable_layers()->RemoveLast();
  EXPECT_THAT(create(d).message(), HasSubstr("layer regions"));
  d = good;
  d.set_page_ids(1, d.page_ids(0));
  EXPECT_THAT(create(d).message(), HasSubstr("named twice"));
  d = good;
  d.clear_reservation_epoch();
  EXPECT_THAT(create(d).message(), HasSubstr("reservation_epoch"));
  d = good;
  d.clear_lease_deadline_unix_ms();
  EXPECT_THAT(create(d).message(), HasSubstr("lease"));
  d = good;  // a lease that ends within the writer's skew margin: nothing may be written
  d.set_lease_deadline_unix_ms(absl::ToUnixMillis(In(KvPusher::kLeaseSkewMargin / 2)));
  EXPECT_EQ(create(d).code(), absl::StatusCode::kDeadlineExceeded);
  // What reaches the transport is bounded: addresses, rkeys, regions that wrap around.
  d = good;
  d.set_worker_address(std::string(kMaxDescriptorAddressBytes + 1, 'a'));
  EXPECT_THAT(create(d).message(), HasSubstr("worker_address of 4097 bytes"));
  d = good;
  d.mutable_ranks(0)->set_worker_address(std::string(kMaxDescriptorAddressBytes + 1, 'a'));
  EXPECT_THAT(create(d).message(), HasSubstr("ranks[0].worker_address of 4097 bytes"));
  d = good;
  d.mutable_ranks(0)->mutable_layers(1)->set_rkey(std::string(kMaxDescriptorRkeyBytes + 1, 'k'));
  EXPECT_THAT(create(d).message(), HasSubstr("rkey of 4097 bytes"));
  d = good;
  d.mutable_ranks(0)->mutable_layers(1)->clear_rkey();
  EXPECT_THAT(create(d).message(), HasSubstr("rkey of 0 bytes"));
  d = good;
  d.mutable_ranks(0)->mutable_layers(2)->set_base_address(~uint64_t{0} - 100);
  EXPECT_THAT(create(d).message(), HasSubstr("wraps around"));
  EXPECT_EQ(w.cache.connects(), connects);  // none of them connected
  // Bad PushLayer arguments.
  auto pusher = KvPusher::Create(*prefill, w.cache, w.replies, *w.prefill, good, w.seal,
                                 Fingerprint(), kPrompt, In(absl::Seconds(5)));
  ASSERT_TRUE(pusher.ok());
  auto pages = absl::MakeConstSpan(w.local_pages);
  EXPECT_EQ((*pusher)->PushLayer(2, 0, 0, 16, pages.subspan(0, 1), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pusher)->PushLayer(0, 0, 0, 40, pages, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pusher)->PushLayer(0, 0, 16, 20, pages.subspan(0, 1), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pusher)->Complete(1, {}, kPrompt).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvPushTest, CompletionCodecRejectsGarbage) {
  estuary::v1::KvCompletion c;
  c.set_request_id("x");
  c.set_num_tokens(2);
  c.set_provenance(std::string("\x01\xff", 2));
  c.set_reservation_epoch(9);
  const std::string wire = EncodeKvCompletion(c);
  EXPECT_EQ(PeekKvControlKind(wire), KvControlKind::kCompletion);
  auto back = DecodeKvCompletion(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->provenance(), c.provenance());
  EXPECT_EQ(back->reservation_epoch(), 9u);
  std::string corrupted = wire;
  CorruptBytes(corrupted);
  EXPECT_FALSE(DecodeKvCompletion(corrupted).ok());
  EXPECT_FALSE(DecodeKvCompletion("").ok());
  EXPECT_FALSE(DecodeKvCompletion(wire.substr(0, wire.size() - 1)).ok());
  auto refused = [](estuary::v1::KvCompletion bad) {
    return DecodeKvCompletion(EncodeKvCompletion(bad)).status().code();
  };
  estuary::v1::KvCompletion bad = c;
  bad.set_num_tokens(3);  // provenance length mismatch
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.clear_reservation_epoch();
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.set_request_id(std::string(kMaxKvRequestIdBytes + 1, 'r'));
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.set_num_tokens(kMaxKvPromptTokens + 1);
  bad.set_status_code(static_cast<int>(absl::StatusCode::kAborted));  // no provenance check
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.set_status_code(17);
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.set_status_code(static_cast<int>(absl::StatusCode::kAborted));
  bad.set_status_message(std::string(kMaxKvStatusMessageBytes + 1, 'm'));
  EXPECT_EQ(refused(bad), absl::StatusCode::kInvalidArgument);
  // An attach is not a completion, and the other way round.
  estuary::v1::KvAttach a;
  a.set_request_id("x");
  a.set_reservation_epoch(9);
  a.set_writer_address("addr");
  EXPECT_EQ(DecodeKvCompletion(EncodeKvAttach(a)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeKvAttach(wire).ok());
}

TEST(KvPushTest, AttachCodecsBoundEveryField) {
  estuary::v1::KvAttach a;
  a.set_request_id("req");
  a.set_reservation_epoch(0x1234);
  a.set_writer_address("writer");
  a.set_descriptor_digest(std::string(kKvAttachDigestBytes, 'd'));
  const std::string wire = EncodeKvAttach(a);
  EXPECT_EQ(PeekKvControlKind(wire), KvControlKind::kAttach);
  auto back = DecodeKvAttach(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->writer_address(), "writer");
  estuary::v1::KvAttach bad = a;
  bad.clear_reservation_epoch();
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());
  bad = a;
  bad.set_writer_address(std::string(kMaxKvWriterAddressBytes + 1, 'w'));
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());
  bad = a;
  bad.clear_writer_address();
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());
  bad = a;
  bad.clear_request_id();
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());
  bad = a;
  bad.clear_descriptor_digest();
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());
  bad.set_descriptor_digest(std::string(kKvAttachDigestBytes + 1, 'd'));
  EXPECT_FALSE(DecodeKvAttach(EncodeKvAttach(bad)).ok());

  estuary::v1::KvAttachReply r;
  r.set_request_id("req");
  r.set_reservation_epoch(0x1234);
  r.set_status_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  r.set_status_message("aborted");
  auto reply = DecodeKvAttachReply(EncodeKvAttachReply(r));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status_message(), "aborted");
  r.set_status_code(-1);
  EXPECT_FALSE(DecodeKvAttachReply(EncodeKvAttachReply(r)).ok());
  EXPECT_EQ(PeekKvControlKind("EKX1 and more"), KvControlKind::kUnknown);
}

// --- Sealed descriptors (README "Sealed descriptors") ----------------------------------------

// Every float of every region of `pool` still kDstFill.
bool Untouched(const KvPool& pool) {
  for (int s = 0; s < pool.num_shards(); ++s) {
    for (int l = 0; l < kLayers; ++l) {
      const KvRegion r = pool.layer_region(l, s);
      const float* f = static_cast<const float*>(r.data);
      if (!std::all_of(f, f + r.bytes / sizeof(float), [](float v) { return v == kDstFill; })) {
        return false;
      }
    }
  }
  return true;
}

// Nothing of a descriptor without its decode worker's seal is used: not even a connect.
TEST(KvPushSealTest, AMissingWrongOrStaleSealIsRefusedBeforeAnyConnect) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 1, 1);
  const estuary::v1::TransferDescriptor good = w.Describe("r");
  auto create = [&](const estuary::v1::TransferDescriptor& d) {
    return w.Pusher(*prefill, d).status();
  };
  auto d = good;
  d.clear_seal();
  absl::Status s = create(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("'r' carries no seal"));
  d = good;
  DescriptorSeal("another cluster's key, 32 bytes!").Seal(&d);
  s = create(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("does not match"));
  d = good;  // a region moved by one page, the seal kept: what corrupted the decode worker
  d.mutable_ranks(0)->mutable_layers(1)->set_base_address(
      d.ranks(0).layers(1).base_address() + w.decode->layout().page_bytes());
  EXPECT_EQ(create(d).code(), absl::StatusCode::kUnauthenticated);
  d = good;  // a corrupted worker address (what aborted the prefill worker inside UCX)
  d.mutable_worker_address()->back() ^= 0x10;
  EXPECT_EQ(create(d).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(w.cache.connects(), 0);
  EXPECT_TRUE(create(good).ok());
  EXPECT_EQ(w.cache.connects(), 1);
}

// Without a key (a cluster without a token) nothing checks the seal, but the decode side still
// refuses the attach of a writer holding a descriptor it did not issue: not one put is posted.
TEST(KvPushSealTest, WithoutAKeyTheDecodeSideRefusesAWriterHoldingAnAlteredDescriptor) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 1, 1, DescriptorSeal::None());
  const int64_t page_bytes = w.decode->layout().page_bytes();
  const std::vector<
      std::pair<const char*, std::function<void(estuary::v1::TransferDescriptor&)>>>
      alterations = {
          {"pages swapped", [](auto& d) { d.mutable_page_ids()->SwapElements(0, 1); }},
          {"a page it did not reserve", [](auto& d) { d.set_page_ids(2, 6); }},
          {"a region moved by a page",
           [page_bytes](auto& d) {
             auto* layer = d.mutable_ranks(0)->mutable_layers(0);
             layer->set_base_address(layer->base_address() + page_bytes);
           }},
          {"a longer lease",
           [](auto& d) { d.set_lease_deadline_unix_ms(d.lease_deadline_unix_ms() + 60000); }},
      };
  for (const auto& [what, alter] : alterations) {
    SCOPED_TRACE(what);
    estuary::v1::TransferDescriptor d = w.Describe(absl::StrCat("altered: ", what));
    EXPECT_TRUE(d.seal().empty());
    alter(d);
    auto pusher = w.Pusher(*prefill, d);
    ASSERT_TRUE(pusher.ok()) << pusher.status();  // in bounds, and nothing checks a seal
    const absl::Status s = PushPrompt(**pusher, 1, w.local_pages, 16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("did not issue"));
    EXPECT_EQ((*pusher)->puts(), 0);
    (void)(*pusher)->Abort(s);
  }
  EXPECT_TRUE(Untouched(*w.decode));
  // The descriptor as issued is taken.
  auto pusher = w.Pusher(*prefill, "as issued");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  EXPECT_TRUE(PushPrompt(**pusher, 1, w.local_pages, 16).ok());
}

// --- Fencing: the writer's side -------------------------------------------------------------

// A refused attach: not one put is posted, and the pusher stays failed.
TEST(KvPushFenceTest, NoPutWithoutAnAcceptedAttach) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 1, 1);
  {
    absl::MutexLock lock(&w.mu);
    w.refuse.insert("refused");
  }
  auto pusher = w.Pusher(*prefill, "refused");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  absl::Status s = PushPrompt(**pusher, 1, w.local_pages, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("refused"));
  EXPECT_EQ((*pusher)->puts(), 0);
  EXPECT_EQ(CountMismatches(*w.decode, w.remote_pages, 0), 0);  // every byte untouched
  EXPECT_EQ((*pusher)->Complete(7, Provenance(), kPrompt).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.receiver->attaches(), 1);
}

// The writer stops at the lease less kLeaseSkewMargin: the first chunk lands, nothing after the
// write deadline does, Complete is refused, and the abort completion carries the epoch.
TEST(KvPushFenceTest, TheWriterStopsAtItsWriteDeadline) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  World w(*prefill, *decode, 1, 1);
  auto pusher = w.Pusher(*prefill, "leased", absl::Seconds(10),
                         /*lease=*/KvPusher::kLeaseSkewMargin + absl::Milliseconds(900));
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const auto pages = absl::MakeConstSpan(w.local_pages);
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE((*pusher)->PushLayer(0, l, 0, kBlock, pages.subspan(0, 1), 0).ok());
  }
  absl::SleepFor((*pusher)->write_deadline() - absl::Now() + absl::Milliseconds(20));
  const int64_t puts = (*pusher)->puts();
  absl::Status late = (*pusher)->PushLayer(0, 0, kBlock, kPrompt, pages.subspan(1, 2), 1);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_EQ((*pusher)->puts(), puts);
  EXPECT_FALSE((*pusher)->late_put());
  EXPECT_FALSE((*pusher)->Complete(7, Provenance(), kPrompt).ok());
  ASSERT_TRUE((*pusher)->Abort(late).ok());
  auto c = w.inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(c->reservation_epoch(), w.epochs);
  EXPECT_FALSE(c->late_put());
  EXPECT_EQ(CountMismatches(*w.decode, w.remote_pages, kBlock), 0);  // only the first page
}

// --- Faults (FaultTransport on the prefill side) ---------------------------------------------

struct FaultWorld {
  explicit FaultWorld(const FaultConfig& config, int src_tp = 1, int dst_tp = 1)
      : prefill(InProcessTransport::Create(), config),
        decode(InProcessTransport::Create()),
        world(std::make_unique<World>(prefill, *decode, src_tp, dst_tp)) {}
  FaultTransport prefill;
  std::unique_ptr<InProcessTransport> decode;
  std::unique_ptr<World> world;
};

TEST(KvPushFaultTest, DroppedCompletionNeverArrives) {
  FaultWorld f({.drop_all_messages = true, .message_filter = IsCompletion});
  auto pusher = f.world->Pusher(f.prefill, "dropped");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  ASSERT_TRUE(PushPrompt(**pusher, 1, f.world->local_pages, 16).ok());
  ASSERT_TRUE((*pusher)->Complete(7, Provenance(), kPrompt).ok());  // looks sent
  EXPECT_FALSE(f.world->inbox.Wait(absl::Milliseconds(300)).has_value());
  EXPECT_EQ(f.world->receiver->completions(), 0);  // the decode lease frees the pages
}

TEST(KvPushFaultTest, DelayedCompletionArrivesLate) {
  FaultWorld f({.message_delay = absl::Milliseconds(150), .message_filter = IsCompletion});
  auto pusher = f.world->Pusher(f.prefill, "slow");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  ASSERT_TRUE(PushPrompt(**pusher, 1, f.world->local_pages, 16).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*pusher)->Complete(7, Provenance(), kPrompt).ok());
  auto c = f.world->inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_EQ(c->request_id(), "slow");
  EXPECT_EQ(CountMismatches(*f.world->decode, f.world->remote_pages, kPrompt), 0);
}

TEST(KvPushFaultTest, DelayPastDeadlineFailsTheRequest) {
  FaultWorld f({.put_delay = absl::Milliseconds(400)});
  auto pusher = f.world->Pusher(f.prefill, "late", absl::Milliseconds(200));
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const absl::Time start = absl::Now();
  absl::Status s = PushPrompt(**pusher, 1, f.world->local_pages, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(KvPushFaultTest, CorruptedCompletionIsDroppedAndTheEndpointReused) {
  FaultWorld f({.corrupt_message_index = 0, .message_filter = IsCompletion});
  auto first = f.world->Pusher(f.prefill, "corrupted");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(PushPrompt(**first, 1, f.world->local_pages, 16).ok());
  ASSERT_TRUE((*first)->Complete(7, Provenance(), kPrompt).ok());
  EXPECT_FALSE(f.world->inbox.Wait(absl::Milliseconds(200)).has_value());
  EXPECT_EQ(f.world->receiver->dropped_messages(), 1);
  // The next request on the same (cached) endpoint goes through.
  auto second = f.world->Pusher(f.prefill, "fine");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(PushPrompt(**second, 1, f.world->local_pages, 16).ok());
  ASSERT_TRUE((*second)->Complete(8, Provenance(), kPrompt).ok());
  auto c = f.world->inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request_id(), "fine");
  EXPECT_EQ(f.world->cache.connects(), 1);
}

TEST(KvPushFaultTest, FailAfterNMakesPushFailAndAbortGoesOut) {
  FaultWorld f({.fail_after_ops = 5}, 2, 2);
  auto pusher = f.world->Pusher(f.prefill, "failing");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  absl::Status s = PushPrompt(**pusher, 2, f.world->local_pages, 16);
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // Sticky: the request stays failed.
  EXPECT_EQ((*pusher)->Complete(7, Provenance(), kPrompt).code(), absl::StatusCode::kUnavailable);
  // Abort reconnects (the cached endpoint failed) and tells the decode worker.
  ASSERT_TRUE((*pusher)->Abort(s).ok());
  auto c = f.world->inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request_id(), "failing");
  EXPECT_EQ(c->status_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(c->status_message(), HasSubstr("fault injection"));
  EXPECT_TRUE((*pusher)->Abort(s).ok());  // idempotent
}

TEST(KvPushFaultTest, DeadPeerIsUnavailableForThisRequestOnly) {
  auto prefill = InProcessTransport::Create();
  auto decode = InProcessTransport::Create();
  auto w = std::make_unique<World>(*prefill, *decode, 1, 2);
  auto pusher = w->Pusher(*prefill, "orphan");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  w->receiver.reset();
  decode.reset();  // the decode worker dies
  const absl::Time start = absl::Now();
  absl::Status s = PushPrompt(**pusher, 1, w->local_pages, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_FALSE((*pusher)->Abort(s).ok());  // nobody to tell; the lease was on the dead side
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  pusher->reset();
  w.reset();  // one World (AttachReplies) per prefill transport at a time

  // A new decode worker: the same prefill transport and cache serve it.
  auto decode2 = InProcessTransport::Create();
  World w2(*prefill, *decode2, 1, 2);
  auto ok = w2.Pusher(*prefill, "next");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(PushPrompt(**ok, 1, w2.local_pages, 16).ok());
  ASSERT_TRUE((*ok)->Complete(1, Provenance(), kPrompt).ok());
  ASSERT_TRUE(w2.inbox.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(CountMismatches(*w2.decode, w2.remote_pages, kPrompt), 0);
}

// A writer that stalls between its deadline check and the post (a stopped process) posts late:
// the pusher notices and says so in its completion, for the decode side to act on.
TEST(KvPushFenceTest, AStalledPutIsReportedLate) {
  FaultWorld f({.put_delay = absl::Milliseconds(600), .stall_puts = true});
  auto pusher = f.world->Pusher(f.prefill, "stalled", absl::Seconds(10),
                                /*lease=*/KvPusher::kLeaseSkewMargin + absl::Milliseconds(300));
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const auto pages = absl::MakeConstSpan(f.world->local_pages);
  ASSERT_TRUE((*pusher)->PushLayer(0, 0, 0, kBlock, pages.subspan(0, 1), 0).ok());
  EXPECT_TRUE((*pusher)->late_put());
  ASSERT_TRUE((*pusher)->Abort(absl::DeadlineExceededError("lease")).ok());
  auto c = f.world->inbox.Wait(absl::Seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->late_put());
}

// A lost attach (a connection that broke under it) costs a resend interval, not the deadline.
TEST(KvPushFenceTest, ALostAttachIsSentAgain) {
  FaultWorld f({.drop_message_index = 0, .message_filter = [](std::string_view payload) {
                  return PeekKvControlKind(payload) == KvControlKind::kAttach;
                }});
  auto pusher = f.world->Pusher(f.prefill, "resent");
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(PushPrompt(**pusher, 1, f.world->local_pages, 16).ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, KvPusher::kAttachResend);
  EXPECT_LT(took, KvPusher::kAttachResend + absl::Seconds(2));
  EXPECT_EQ(f.world->receiver->attaches(), 1);  // the dropped one never arrived
  ASSERT_TRUE((*pusher)->Complete(7, Provenance(), kPrompt).ok());
  ASSERT_TRUE(f.world->inbox.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(CountMismatches(*f.world->decode, f.world->remote_pages, kPrompt), 0);
}

}  // namespace
}  // namespace estuary::kvtransfer
