#pragma once
// Checks every Transport implementation must pass, shared by the in-process and UCX tests.
// `sender` pushes into memory registered with `receiver`.

#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_transport.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer::testing {

inline absl::Time In(absl::Duration d) { return absl::Now() + d; }

inline std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 9));
  return v;
}

// Puts land byte-exact at their offsets, untouched bytes stay as they were; both registered
// (caller memory) and allocated regions.
inline void CheckPutsLandByteExact(Transport& sender, Transport& receiver) {
  std::vector<uint8_t> pool(1 << 20, 0x11);
  auto registered = receiver.RegisterRegion(pool.data(), pool.size());
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto allocated = receiver.AllocateRegion(256 << 10);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*registered)->Describe());
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto dst2 = (*ep)->ImportRegion((*allocated)->Describe());
  ASSERT_TRUE(dst2.ok()) << dst2.status();

  const std::vector<uint8_t> a = Pattern(64 << 10, 3);
  const std::vector<uint8_t> b = Pattern(300 << 10, 7);
  const std::vector<uint8_t> c = Pattern(100, 9);
  ASSERT_TRUE((*ep)->Put(a.data(), a.size(), **dst, 0, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Put(b.data(), b.size(), **dst, 512 << 10, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Put(c.data(), c.size(), **dst2, 1000, In(absl::Seconds(5))).ok());
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
  EXPECT_EQ(std::memcmp(pool.data(), a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(pool.data() + (512 << 10), b.data(), b.size()), 0);
  EXPECT_EQ(pool[a.size()], 0x11);
  EXPECT_EQ(pool[(512 << 10) - 1], 0x11);
  EXPECT_EQ(pool[(512 << 10) + b.size()], 0x11);
  const auto* al = static_cast<const uint8_t*>((*allocated)->data());
  EXPECT_EQ(std::memcmp(al + 1000, c.data(), c.size()), 0);
  EXPECT_EQ(al[999], 0);

  // Out of bounds is refused before anything moves.
  absl::Status oob = (*ep)->Put(a.data(), a.size(), **dst, pool.size() - 10, In(absl::Seconds(1)));
  EXPECT_EQ(oob.code(), absl::StatusCode::kInvalidArgument) << oob;
  ep->reset();  // endpoints close before regions go
}

// Messages arrive in order, stamped with the sender's id; ReceiveFrom filters by peer.
inline void CheckMessagesArrive(Transport& sender, Transport& receiver) {
  auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE((*ep)->SendMessage("msg" + std::to_string(i), In(absl::Seconds(5))).ok());
  }
  std::string big(200 << 10, 'x');
  big[12345] = 'y';
  ASSERT_TRUE((*ep)->SendMessage(big, In(absl::Seconds(5))).ok());
  for (int i = 0; i < 20; ++i) {
    auto m = receiver.PollMessage(In(absl::Seconds(5)));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->payload, "msg" + std::to_string(i));
    EXPECT_EQ(m->sender_id, sender.id());
  }
  // The receiver connects back and receives only from that peer.
  auto back = receiver.Connect(sender.Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(back.ok()) << back.status();
  auto m = receiver.ReceiveFrom(**back, In(absl::Seconds(5)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->payload, big);
  const std::string too_big(Transport::kMaxMessageBytes + 1, 'z');
  EXPECT_EQ((*ep)->SendMessage(too_big, In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
}

inline void CheckWaitsHonourDeadlines(Transport& sender, Transport& receiver) {
  const absl::Time start = absl::Now();
  auto m = receiver.PollMessage(In(absl::Milliseconds(100)));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  auto back = receiver.Connect(sender.Address(), In(absl::Seconds(5)));
  ASSERT_TRUE(back.ok()) << back.status();
  auto from = receiver.ReceiveFrom(**back, In(absl::Milliseconds(100)));
  EXPECT_EQ(from.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Fault modes over any transport pair; `make_sender` gives a fresh inner sender per mode.
inline void CheckFaultModes(const std::function<std::unique_ptr<Transport>()>& make_sender,
                            Transport& receiver) {
  std::vector<uint8_t> pool(64 << 10, 0);
  auto region = receiver.RegisterRegion(pool.data(), pool.size());
  ASSERT_TRUE(region.ok()) << region.status();
  const std::vector<uint8_t> data = Pattern(4096, 1);
  {  // Drop the 2nd message, corrupt the 3rd.
    FaultConfig config;
    config.drop_message_index = 1;
    config.corrupt_message_index = 2;
    FaultTransport sender(make_sender(), config);
    auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
    ASSERT_TRUE(ep.ok()) << ep.status();
    for (const char* s : {"zero", "one", "two-is-corrupted", "three"}) {
      ASSERT_TRUE((*ep)->SendMessage(s, In(absl::Seconds(5))).ok());
    }
    auto m0 = receiver.PollMessage(In(absl::Seconds(5)));
    auto m2 = receiver.PollMessage(In(absl::Seconds(5)));
    auto m3 = receiver.PollMessage(In(absl::Seconds(5)));
    ASSERT_TRUE(m0.ok() && m2.ok() && m3.ok());
    EXPECT_EQ(m0->payload, "zero");
    std::string corrupted = "two-is-corrupted";
    CorruptBytes(corrupted);
    EXPECT_EQ(m2->payload, corrupted);
    EXPECT_NE(m2->payload, "two-is-corrupted");
    EXPECT_EQ(m3->payload, "three");
    EXPECT_EQ(receiver.PollMessage(In(absl::Milliseconds(50))).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  {  // Drop everything: sends succeed, nothing arrives; puts still work.
    FaultConfig config;
    config.drop_all_messages = true;
    FaultTransport sender(make_sender(), config);
    auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
    ASSERT_TRUE(ep.ok()) << ep.status();
    auto dst = (*ep)->ImportRegion((*region)->Describe());
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
    ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
    EXPECT_EQ(std::memcmp(pool.data(), data.data(), data.size()), 0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ep)->SendMessage("lost", In(absl::Seconds(5))).ok());
    EXPECT_EQ(receiver.PollMessage(In(absl::Milliseconds(100))).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  {  // Delays: honoured within the deadline, DEADLINE_EXCEEDED past it.
    FaultConfig config;
    config.message_delay = absl::Milliseconds(100);
    config.put_delay = absl::Milliseconds(100);
    FaultTransport sender(make_sender(), config);
    auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
    ASSERT_TRUE(ep.ok()) << ep.status();
    auto dst = (*ep)->ImportRegion((*region)->Describe());
    ASSERT_TRUE(dst.ok());
    absl::Time start = absl::Now();
    ASSERT_TRUE((*ep)->SendMessage("late", In(absl::Seconds(5))).ok());
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
    auto m = receiver.PollMessage(In(absl::Seconds(5)));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->payload, "late");
    start = absl::Now();
    EXPECT_EQ((*ep)->SendMessage("too late", In(absl::Milliseconds(20))).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Milliseconds(20))).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(90));
    start = absl::Now();
    EXPECT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
    EXPECT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
  }
  {  // Fail after 3 operations: then UNAVAILABLE everywhere, including waits on that peer.
    FaultConfig config;
    config.fail_after_ops = 3;
    FaultTransport sender(make_sender(), config);
    auto ep = sender.Connect(receiver.Address(), In(absl::Seconds(5)));
    ASSERT_TRUE(ep.ok()) << ep.status();
    auto dst = (*ep)->ImportRegion((*region)->Describe());
    ASSERT_TRUE(dst.ok());
    EXPECT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).ok());
    EXPECT_TRUE((*ep)->Put(data.data(), data.size(), **dst, 4096, In(absl::Seconds(5))).ok());
    EXPECT_TRUE((*ep)->Flush(In(absl::Seconds(5))).ok());
    EXPECT_TRUE((*ep)->Health().ok());
    EXPECT_EQ((*ep)->SendMessage("x", In(absl::Seconds(5))).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ((*ep)->Put(data.data(), data.size(), **dst, 0, In(absl::Seconds(5))).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ((*ep)->Flush(In(absl::Seconds(5))).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ((*ep)->Health().code(), absl::StatusCode::kUnavailable);
    const absl::Time start = absl::Now();
    EXPECT_EQ(sender.ReceiveFrom(**ep, In(absl::Seconds(5))).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    EXPECT_EQ(receiver.PollMessage(In(absl::Milliseconds(50))).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
}

}  // namespace estuary::kvtransfer::testing
