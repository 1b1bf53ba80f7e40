// NcclTransport's protocol (handshake, put headers, in-order receives, flush acks, failures,
// message pass-through) over FakeNcclBackend and in-process control transports: no GPU needed.
// The CUDA + NCCL backend itself is exercised by nccl_transport_test.cc (label gpu).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/nccl_transport.h"
#include "kvtransfer/nccl_transport_fake.h"
#include "kvtransfer/nccl_transport_wire.h"
#include "kvtransfer/transport_test_util.h"
#include "kvtransfer/ucx_transport.h"

namespace estuary::kvtransfer {
namespace {

using nccl::FakeNcclBackend;
using testing::In;
using testing::Pattern;

// An NcclTransport over a fresh in-process control transport and a fake backend.
struct Fake {
  std::unique_ptr<NcclTransport> transport;
  FakeNcclBackend* backend = nullptr;  // owned by the transport
  std::string control_address;
};

// `control`: "inproc", or "ucx-tcp" for a UcxTransport over tcp.
Fake MakeFake(const NcclTransportOptions& options = {},
              const std::string& control_kind = "inproc") {
  Fake f;
  auto backend = std::make_unique<FakeNcclBackend>();
  f.backend = backend.get();
  std::unique_ptr<Transport> control;
  if (control_kind == "ucx-tcp") {
    UcxTransportOptions ucx;
    ucx.tls = "tcp";
    auto t = UcxTransport::Create(ucx);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return f;
    control = std::move(*t);
  } else {
    control = InProcessTransport::Create();
  }
  f.control_address = control->Address();
  auto t = NcclTransport::CreateWithBackend(std::move(control), std::move(backend), options);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t.ok()) f.transport = std::move(*t);
  return f;
}

// Waits until `pred` holds (polling), up to `timeout`.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

TEST(NcclTransportWireTest, FramesRoundTripAndMalformedOnesAreRefused) {
  using nccl::FrameType;
  const std::string put =
      nccl::Writer(FrameType::kPut).U64(7).U64(3).U64(11).U64(4096).U64(1 << 20).Take();
  ASSERT_TRUE(nccl::IsFrame(put));
  absl::StatusOr<nccl::Frame> f = nccl::ParseFrame(put);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, FrameType::kPut);
  EXPECT_EQ(f->conn, 7u);
  EXPECT_EQ(f->seq, 3u);
  EXPECT_EQ(f->key, 11u);
  EXPECT_EQ(f->offset, 4096u);
  EXPECT_EQ(f->bytes, 1u << 20);

  const std::string hello =
      nccl::Writer(FrameType::kHello).U64(9).U32(1).Str("group").Str("address").Take();
  f = nccl::ParseFrame(hello);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->text, "group");
  EXPECT_EQ(f->address, "address");

  const std::string fail =
      nccl::StatusFrame(FrameType::kFail, 5, absl::FailedPreconditionError("no such region"));
  f = nccl::ParseFrame(fail);
  ASSERT_TRUE(f.ok()) << f.status();
  const absl::Status carried = nccl::FrameStatus(*f, "receiver");
  EXPECT_EQ(carried.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(carried.message(), "nccl receiver failed the connection: no such region");

  // Every truncation, trailing bytes, and unknown types are refused.
  for (size_t n = nccl::kMagic.size() + 1; n < put.size(); ++n) {
    EXPECT_EQ(nccl::ParseFrame(put.substr(0, n)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << n;
  }
  EXPECT_FALSE(nccl::ParseFrame(put + "x").ok());
  EXPECT_FALSE(nccl::ParseFrame(std::string(nccl::kMagic) + '\x00').ok());
  EXPECT_FALSE(nccl::ParseFrame(std::string(nccl::kMagic) + '\x0a').ok());
  EXPECT_FALSE(nccl::IsFrame(nccl::kMagic));
  EXPECT_FALSE(nccl::IsFrame("EKC1 a completion"));

  uint64_t owner = 0, key = 0;
  ASSERT_TRUE(nccl::DecodeRkey(nccl::EncodeRkey(123, 456), &owner, &key).ok());
  EXPECT_EQ(owner, 123u);
  EXPECT_EQ(key, 456u);
  EXPECT_EQ(nccl::DecodeRkey("short", &owner, &key).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportProtocolTest, PutsLandByteExact) {
  Fake a = MakeFake(), b = MakeFake();
  testing::CheckPutsLandByteExact(*a.transport, *b.transport);
}

TEST(NcclTransportProtocolTest, MessagesArrive) {
  Fake a = MakeFake(), b = MakeFake();
  testing::CheckMessagesArrive(*a.transport, *b.transport);
}

TEST(NcclTransportProtocolTest, WaitsHonourDeadlines) {
  Fake a = MakeFake(), b = MakeFake();
  testing::CheckWaitsHonourDeadlines(*a.transport, *b.transport);
}

TEST(NcclTransportProtocolTest, FaultModes) {
  Fake receiver = MakeFake();
  testing::CheckFaultModes([]() -> std::unique_ptr<Transport> { return MakeFake().transport; },
                           *receiver.transport);
}

// The same over UCX (tcp) control transports: messages, headers and acks cross real endpoints,
// and the accepting side connects back from its own thread.
TEST(NcclTransportProtocolTest, OverUcxControl) {
  Fake a = MakeFake({}, "ucx-tcp"), b = MakeFake({}, "ucx-tcp");
  ASSERT_TRUE(a.transport != nullptr && b.transport != nullptr);
  testing::CheckPutsLandByteExact(*a.transport, *b.transport);
  testing::CheckMessagesArrive(*a.transport, *b.transport);
  auto region = b.transport->AllocateRegion(64 << 10);
  ASSERT_TRUE(region.ok());
  auto ep = a.transport->Connect(b.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  const std::vector<uint8_t> data = Pattern(64 << 10, 8);
  ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
  region->reset();
  b.transport.reset();  // the UCX peer goes away
  const absl::Time start = absl::Now();
  EXPECT_FALSE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok() &&
               (*ep)->Flush(In(absl::Seconds(5))).ok());
  EXPECT_EQ((*ep)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(NcclTransportProtocolTest, KindAddressAndArguments) {
  Fake a = MakeFake();
  EXPECT_EQ(a.transport->kind(), "nccl");
  EXPECT_EQ(a.transport->Address(), a.control_address);
  EXPECT_EQ(a.transport->id(), Transport::PeerId(a.control_address));

  EXPECT_EQ(NcclTransport::CreateWithBackend(nullptr, std::make_unique<FakeNcclBackend>(), {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      NcclTransport::CreateWithBackend(InProcessTransport::Create(), nullptr, {}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclTransport::Create(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  NcclTransportOptions bad_device;
  bad_device.device = -1;
  EXPECT_EQ(NcclTransport::Create(InProcessTransport::Create(), bad_device).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.transport->RegisterRegion(nullptr, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.transport->AllocateRegion(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.transport->Connect("", In(absl::Seconds(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportProtocolTest, HostMemoryIsRefused) {
  Fake sender = MakeFake(), receiver = MakeFake();
  std::vector<uint8_t> host(4096, 1);
  std::vector<uint8_t> device(4096, 0);
  receiver.backend->MarkHostMemory(host.data(), host.size());
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> refused =
      receiver.transport->RegisterRegion(host.data(), host.size());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("host memory"), absl::string_view::npos);

  auto region = receiver.transport->RegisterRegion(device.data(), device.size());
  ASSERT_TRUE(region.ok()) << region.status();
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok()) << dst.status();
  sender.backend->MarkHostMemory(host.data(), host.size());
  absl::Status put = (*ep)->Put(host.data() + 100, 64, **dst, 0, In(absl::Seconds(5)));
  EXPECT_EQ(put.code(), absl::StatusCode::kInvalidArgument) << put;
  EXPECT_NE(put.message().find("put source"), absl::string_view::npos) << put;
  // Refused before anything moved: the endpoint is still usable.
  EXPECT_TRUE((*ep)->Health().ok());
  const std::vector<uint8_t> data = Pattern(512, 5);
  ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 8, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Put(data.data(), 0, **dst, 4096, In(absl::Seconds(5))).ok());  // empty
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
  EXPECT_EQ(std::memcmp(device.data() + 8, data.data(), data.size()), 0);
}

TEST(NcclTransportProtocolTest, ImportRegionChecksTheDescriptor) {
  Fake sender = MakeFake(), receiver = MakeFake(), other = MakeFake();
  auto theirs = other.transport->AllocateRegion(1024);
  ASSERT_TRUE(theirs.ok());
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  absl::StatusOr<const RemoteRegion*> wrong_owner = (*ep)->ImportRegion((*theirs)->Describe());
  EXPECT_EQ(wrong_owner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ep)->ImportRegion({1234, 1024, "ucx-rkey"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Payloads that look like protocol frames are escaped and arrive unchanged.
TEST(NcclTransportProtocolTest, ReservedPrefixMessagesPassThrough) {
  Fake sender = MakeFake(), receiver = MakeFake();
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  const std::string magic("\0ESTNCCL", 8);
  const std::vector<std::string> payloads = {magic, magic + '\x03' + "looks like a PUT",
                                             magic + '\x01', magic + '\xff', ""};
  for (const std::string& p : payloads) {
    ASSERT_TRUE((*ep)->SendMessage(p, In(absl::Seconds(5))).ok());
  }
  for (const std::string& p : payloads) {
    auto m = receiver.transport->PollMessage(In(absl::Seconds(5)));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->payload, p);
    EXPECT_EQ(m->sender_id, sender.transport->id());
  }
  const std::string longest = magic + std::string(Transport::kMaxMessageBytes - magic.size(), 'x');
  EXPECT_EQ((*ep)->SendMessage(longest, In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
}

// More puts than max_outstanding_puts between flushes: Put waits for the oldest send.
TEST(NcclTransportProtocolTest, ManyPutsBetweenFlushes) {
  NcclTransportOptions options;
  options.max_outstanding_puts = 4;
  Fake sender = MakeFake(options), receiver = MakeFake();
  auto region = receiver.transport->AllocateRegion(300 * 1000);
  ASSERT_TRUE(region.ok());
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  const std::vector<uint8_t> data = Pattern(300 * 1000, 11);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(
          (*ep)->Put(data.data() + i * 1000, 1000, **dst, i * 1000, In(absl::Seconds(5))).ok());
    }
    ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
    EXPECT_EQ(std::memcmp((*region)->data(), data.data(), data.size()), 0);
  }
  EXPECT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());  // nothing new: no round trip needed
}

TEST(NcclTransportProtocolTest, OrderlyCloseEndsBothSides) {
  Fake sender = MakeFake(), receiver = MakeFake();
  auto region = receiver.transport->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  {
    const std::vector<uint8_t> data = Pattern(4096, 2);  // must outlive the endpoint's flush
    auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
    ASSERT_TRUE(ep.ok()) << ep.status();
    EXPECT_EQ(receiver.transport->accepted_connections(), 1u);
    auto dst = (*ep)->ImportRegion((*region)->Describe());
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
    // No Flush: closing the endpoint flushes.
  }
  EXPECT_TRUE(Eventually([&] { return receiver.transport->accepted_connections() == 0; }));
  EXPECT_EQ(std::memcmp((*region)->data(), Pattern(4096, 2).data(), 4096), 0);
  EXPECT_EQ(sender.backend->links_closed(), 1u);
  EXPECT_EQ(sender.backend->links_aborted(), 0u);
  EXPECT_TRUE(Eventually([&] { return receiver.backend->links_closed() == 1; }));
  EXPECT_EQ(receiver.backend->links_aborted(), 0u);
}

// A dead receiver (its transport destroyed) fails the endpoints to it, not the others.
TEST(NcclTransportProtocolTest, DeadPeerIsUnavailableAndOthersKeepWorking) {
  Fake sender = MakeFake(), dying = MakeFake(), healthy = MakeFake();
  auto region = dying.transport->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  auto ep = sender.transport->Connect(dying.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  auto ok_ep = sender.transport->Connect(healthy.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ok_ep.ok()) << ok_ep.status();
  const std::vector<uint8_t> data = Pattern(1024, 3);
  ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 1024, In(absl::Seconds(5))).ok());

  region->reset();
  dying.transport.reset();
  const absl::Time start = absl::Now();
  absl::Status flush = (*ep)->Flush(In(absl::Seconds(10)));
  EXPECT_EQ(flush.code(), absl::StatusCode::kUnavailable) << flush;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ((*ep)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*ep)->Put(data.data(), 8, **dst, 0, In(absl::Seconds(1))).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*ep)->SendMessage("x", In(absl::Seconds(1))).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender.transport->ReceiveFrom(**ep, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender.backend->links_aborted(), 1u);

  EXPECT_TRUE((*ok_ep)->Health().ok());
  EXPECT_TRUE((*ok_ep)->SendMessage("still fine", In(absl::Seconds(5))).ok());
  auto m = healthy.transport->PollMessage(In(absl::Seconds(5)));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->payload, "still fine");
  EXPECT_TRUE((*ok_ep)->Flush(In(absl::Seconds(5))).ok());
}

// An NCCL asynchronous error on one endpoint's communicator aborts it (both ends) and fails that
// endpoint only.
TEST(NcclTransportProtocolTest, AsyncErrorFailsOnlyThatEndpoint) {
  Fake sender = MakeFake(), r1 = MakeFake(), r2 = MakeFake();
  auto region1 = r1.transport->AllocateRegion(4096);
  auto region2 = r2.transport->AllocateRegion(4096);
  ASSERT_TRUE(region1.ok() && region2.ok());
  auto ep1 = sender.transport->Connect(r1.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep1.ok()) << ep1.status();
  auto ep2 = sender.transport->Connect(r2.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep2.ok()) << ep2.status();
  auto dst1 = (*ep1)->ImportRegion((*region1)->Describe());
  auto dst2 = (*ep2)->ImportRegion((*region2)->Describe());
  ASSERT_TRUE(dst1.ok() && dst2.ok());

  sender.backend->InjectLinkError(0, absl::InternalError("injected NCCL remote error"));
  const std::vector<uint8_t> data = Pattern(2048, 4);
  absl::Status put = (*ep1)->Put(data.data(), data.size(), **dst1, 0, In(absl::Seconds(5)));
  absl::Status flush = (*ep1)->Flush(In(absl::Seconds(5)));
  EXPECT_FALSE(put.ok() && flush.ok());
  const absl::Status first = put.ok() ? flush : put;
  EXPECT_EQ(first.code(), absl::StatusCode::kInternal) << first;
  EXPECT_NE(first.message().find("injected NCCL remote error"), absl::string_view::npos) << first;
  EXPECT_EQ((*ep1)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE((*ep1)->Health().message().find("injected"), absl::string_view::npos);
  EXPECT_EQ((*ep1)->Flush(In(absl::Seconds(1))).code(), absl::StatusCode::kUnavailable);
  // The receiving end was told and aborted too.
  EXPECT_TRUE(Eventually([&] { return r1.transport->accepted_connections() == 0; }));
  EXPECT_EQ(r1.backend->links_aborted(), 1u);

  ASSERT_TRUE((*ep2)->Put(data.data(), data.size(), **dst2, 0, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep2)->Flush(In(absl::Seconds(5))).ok());
  EXPECT_EQ(std::memcmp((*region2)->data(), data.data(), data.size()), 0);
  EXPECT_TRUE((*ep2)->Health().ok());
}

// A put into a region the receiver no longer has fails the connection with the receiver's reason.
TEST(NcclTransportProtocolTest, PutIntoDeregisteredRegionFailsTheConnection) {
  Fake sender = MakeFake(), receiver = MakeFake();
  auto region = receiver.transport->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  region->reset();
  const std::vector<uint8_t> data = Pattern(256, 6);
  ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
  absl::Status flush = (*ep)->Flush(In(absl::Seconds(5)));
  EXPECT_EQ(flush.code(), absl::StatusCode::kUnavailable) << flush;
  EXPECT_NE(flush.message().find("has not registered"), absl::string_view::npos) << flush;
  EXPECT_EQ((*ep)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return receiver.transport->accepted_connections() == 0; }));
}

// A peer that is not an NcclTransport never answers the HELLO: Connect ends at its deadline.
TEST(NcclTransportProtocolTest, ConnectToAPlainTransportTimesOut) {
  Fake sender = MakeFake();
  auto plain = InProcessTransport::Create();
  const absl::Time start = absl::Now();
  auto ep = sender.transport->Connect(plain->Address(), In(absl::Milliseconds(300)));
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kDeadlineExceeded) << ep.status();
  EXPECT_NE(ep.status().message().find("no READY"), absl::string_view::npos) << ep.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(sender.backend->links_aborted(), 1u);
}

// The receiver's side never finishes joining the communicator: Connect ends at its deadline and
// the ABORT it sends ends the receiver's half-made connection long before its accept_timeout.
TEST(NcclTransportProtocolTest, CommunicatorThatNeverForms) {
  Fake sender = MakeFake(), receiver = MakeFake();
  receiver.backend->SetJoinHangs(true);
  auto ep = sender.transport->Connect(receiver.transport->Address(), In(absl::Milliseconds(300)));
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kDeadlineExceeded) << ep.status();
  EXPECT_TRUE(Eventually([&] { return receiver.transport->accepted_connections() == 0; },
                         absl::Seconds(3)));
  EXPECT_EQ(receiver.backend->links_aborted(), 1u);
}

// Destroying the receiving transport while a peer is connected ends its accepted connections and
// the peer's endpoint fails; destroying a transport with live endpoints of its own is safe.
TEST(NcclTransportProtocolTest, ShutdownWithLiveConnections) {
  Fake a = MakeFake(), b = MakeFake();
  auto ab = a.transport->Connect(b.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ab.ok()) << ab.status();
  auto ba = b.transport->Connect(a.transport->Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ba.ok()) << ba.status();
  EXPECT_EQ(a.transport->accepted_connections(), 1u);
  a.transport.reset();  // `ab` (a's own endpoint) outlives it
  EXPECT_EQ((*ab)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return !(*ba)->Health().ok(); }));
  ab->reset();
  ba->reset();
}

}  // namespace
}  // namespace estuary::kvtransfer
