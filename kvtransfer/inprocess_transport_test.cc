#include "kvtransfer/inprocess_transport.h"

#include "gtest/gtest.h"
#include "kvtransfer/transport_test_util.h"

namespace estuary::kvtransfer {
namespace {

using testing::In;

TEST(InProcessTransportTest, PutsLandByteExact) {
  auto a = InProcessTransport::Create();
  auto b = InProcessTransport::Create();
  testing::CheckPutsLandByteExact(*a, *b);
}

TEST(InProcessTransportTest, MessagesArrive) {
  auto a = InProcessTransport::Create();
  auto b = InProcessTransport::Create();
  testing::CheckMessagesArrive(*a, *b);
}

TEST(InProcessTransportTest, WaitsHonourDeadlines) {
  auto a = InProcessTransport::Create();
  auto b = InProcessTransport::Create();
  testing::CheckWaitsHonourDeadlines(*a, *b);
}

TEST(InProcessTransportTest, DeadPeerIsUnavailableAndOthersKeepWorking) {
  auto sender = InProcessTransport::Create();
  auto dying = InProcessTransport::Create();
  auto healthy = InProcessTransport::Create();
  std::vector<uint8_t> pool(4096);
  auto region = dying->RegisterRegion(pool.data(), pool.size());
  ASSERT_TRUE(region.ok());
  auto ep = sender->Connect(dying->Address(), In(absl::Seconds(1)));
  ASSERT_TRUE(ep.ok());
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  auto back = dying->Connect(sender->Address(), In(absl::Seconds(1)));
  ASSERT_TRUE(back.ok());
  auto from_dying = sender->Connect(dying->Address(), In(absl::Seconds(1)));
  ASSERT_TRUE(from_dying.ok());
  dying.reset();
  const char byte = 1;
  EXPECT_EQ((*ep)->Put(&byte, 1, **dst, 0, In(absl::Seconds(1))).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*ep)->SendMessage("x", In(absl::Seconds(1))).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*ep)->Flush(In(absl::Seconds(1))).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender->ReceiveFrom(**from_dying, In(absl::Seconds(1))).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender->Connect("inproc:999999", In(absl::Seconds(1))).status().code(),
            absl::StatusCode::kUnavailable);
  auto ok = sender->Connect(healthy->Address(), In(absl::Seconds(1)));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->SendMessage("still fine", In(absl::Seconds(1))).ok());
  auto m = healthy->PollMessage(In(absl::Seconds(1)));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->payload, "still fine");
}

}  // namespace
}  // namespace estuary::kvtransfer
