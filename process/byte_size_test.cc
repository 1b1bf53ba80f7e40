// --kv-cache-memory's sizes: units, plain bytes, refusals, and the absl flag round trip.
#include "process/byte_size.h"

#include "gtest/gtest.h"

namespace estuary::process {
namespace {

TEST(ByteSizeTest, BinaryAndDecimalUnitsAndPlainBytes) {
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("256MiB"), int64_t{256} << 20);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096);
  EXPECT_EQ(*ParseByteSize("1TiB"), int64_t{1} << 40);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000);
  EXPECT_EQ(*ParseByteSize("512MB"), 512000000);
  EXPECT_EQ(*ParseByteSize("3KB"), 3000);
  EXPECT_EQ(*ParseByteSize("268435456"), 268435456);
  EXPECT_EQ(*ParseByteSize("100B"), 100);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize(" 2 gib "), int64_t{2} << 30);  // case and spaces
}

TEST(ByteSizeTest, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "GiB", "-1GiB", "2XB", "2 GiBs", "1.2.3MB", "0.5", "1e3",
                          "99999999999TiB"}) {
    absl::StatusOr<int64_t> parsed = ParseByteSize(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_NE(parsed.status().message().find("is not a memory size"), absl::string_view::npos);
    }
  }
}

TEST(ByteSizeTest, FormatsAnExactSpelling) {
  EXPECT_EQ(FormatByteSize(int64_t{2} << 30), "2GiB");
  EXPECT_EQ(FormatByteSize(int64_t{256} << 20), "256MiB");
  EXPECT_EQ(FormatByteSize(int64_t{3} << 29), "1536MiB");
  EXPECT_EQ(FormatByteSize(2000000000), "2GB");  // not 1953125KiB
  EXPECT_EQ(FormatByteSize(4096), "4KiB");
  EXPECT_EQ(FormatByteSize(1000), "1KB");
  EXPECT_EQ(FormatByteSize(100), "100");
  EXPECT_EQ(FormatByteSize(0), "0");
}

TEST(ByteSizeTest, AbslFlagRoundTrip) {
  ByteSize size;
  std::string error;
  ASSERT_TRUE(AbslParseFlag("64MiB", &size, &error)) << error;
  EXPECT_EQ(size.bytes, int64_t{64} << 20);
  EXPECT_EQ(AbslUnparseFlag(size), "64MiB");
  EXPECT_FALSE(AbslParseFlag("lots", &size, &error));
  EXPECT_NE(error.find("'lots' is not a memory size"), std::string::npos);
  EXPECT_EQ(size.bytes, int64_t{64} << 20);  // unchanged on failure
}

}  // namespace
}  // namespace estuary::process
