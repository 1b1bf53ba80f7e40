// The advertised address: flags, $POD_IP and the default route, against this host's real
// interfaces (loopback at least).
#include "process/host_address.h"

#include "gtest/gtest.h"

namespace estuary::process {
namespace {

TEST(HostAddressTest, DefaultRouteInterfaceFromProcNetRoute) {
  const char* routes =
      "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
      "eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
      "eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
      "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n";
  EXPECT_EQ(DefaultRouteInterface(routes), "eth0");
  EXPECT_EQ(DefaultRouteInterface("Iface\tDestination\n"), std::nullopt);
  EXPECT_EQ(DefaultRouteInterface(""), std::nullopt);
}

TEST(HostAddressTest, ExplicitAddressMustBeLocal) {
  EXPECT_EQ(*ResolveAdvertiseAddress("127.0.0.1", "0.0.0.0", ""), "127.0.0.1");
  // 198.51.100.7 (TEST-NET-2) is no address of this machine.
  const absl::StatusOr<std::string> foreign = ResolveAdvertiseAddress("198.51.100.7", "0.0.0.0", "");
  ASSERT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("--advertise-address = '198.51.100.7'"),
            std::string::npos)
      << foreign.status();
  EXPECT_EQ(ResolveAdvertiseAddress("0.0.0.0", "0.0.0.0", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveAdvertiseAddress("no-such-host.invalid", "0.0.0.0", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostAddressTest, BoundAddressAndPodIp) {
  EXPECT_EQ(*ResolveAdvertiseAddress("", "127.0.0.1", ""), "127.0.0.1");
  EXPECT_EQ(*ResolveAdvertiseAddress("", "0.0.0.0", "127.0.0.1"), "127.0.0.1");
  const absl::StatusOr<std::string> wrong_pod_ip = ResolveAdvertiseAddress("", "0.0.0.0", "198.51.100.7");
  ASSERT_EQ(wrong_pod_ip.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_pod_ip.status().message().find("$POD_IP"), std::string::npos);
}

TEST(HostAddressTest, WildcardBindAdvertisesTheDefaultRouteInterface) {
  const absl::StatusOr<std::string> chosen = ResolveAdvertiseAddress("", "0.0.0.0", "");
  if (!chosen.ok()) {
    // A host without a default route must say how to fix it.
    EXPECT_EQ(chosen.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(chosen.status().message().find("--advertise-address"), std::string::npos);
    GTEST_SKIP() << "no default route here: " << chosen.status();
  }
  const std::optional<InterfaceAddress> interface = InterfaceOf(*chosen);
  ASSERT_TRUE(interface.has_value()) << *chosen;
  EXPECT_FALSE(interface->loopback) << *chosen;
}

TEST(HostAddressTest, JoinHostPort) {
  EXPECT_EQ(JoinHostPort("10.1.2.3", 80), "10.1.2.3:80");
  EXPECT_EQ(JoinHostPort("fe80::1", 80), "[fe80::1]:80");
  EXPECT_EQ(JoinHostPort("[fe80::1]", 80), "[fe80::1]:80");
  EXPECT_TRUE(IsWildcardHost("0.0.0.0"));
  EXPECT_TRUE(IsWildcardHost("[::]"));
  EXPECT_FALSE(IsWildcardHost("127.0.0.1"));
}

}  // namespace
}  // namespace estuary::process
