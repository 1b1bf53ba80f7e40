#include "kvtransfer/fault_transport.h"

#include "gtest/gtest.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transport_test_util.h"

namespace estuary::kvtransfer {
namespace {

TEST(FaultTransportTest, ModesOverInProcess) {
  auto receiver = InProcessTransport::Create();
  testing::CheckFaultModes([] { return InProcessTransport::Create(); }, *receiver);
}

TEST(FaultTransportTest, CorruptBytesFlipsAndIsDeterministic) {
  std::string a = "completion";
  std::string b = a;
  CorruptBytes(a);
  CorruptBytes(b);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, "completion");
  EXPECT_EQ(a.size(), 10u);
  std::string empty;
  CorruptBytes(empty);
  EXPECT_TRUE(empty.empty());
}

}  // namespace
}  // namespace estuary::kvtransfer
