// bench-decode's reporting (bench_decode.h): the issue-18 targets read off the rows, and the JSON
// and table that carry them. The timed run itself is exercised end to end by
// tests/cli/exit_commands_test.cc (BenchDecodeCommandTest) on a tiny model.

#include "decode/bench_decode.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

BenchDecodeRow Row(const std::string& mode, int batch, double tokens_per_second,
                   double effective_gbps) {
  BenchDecodeRow row;
  row.mode = mode;
  row.batch = batch;
  row.tokens_per_second = tokens_per_second;
  row.effective_bytes_per_second = effective_gbps * 1e9;
  return row;
}

TEST(BenchDecodeTargetsTest, RatiosAgainstFullDepthAndTheBandwidthFloor) {
  const std::vector<BenchDecodeRow> rows = {
      Row("full", 1, 10.0, 31.0), Row("river", 1, 20.0, 29.0), Row("int4", 1, 26.0, 14.0),
      Row("full", 4, 40.0, 31.0), Row("river", 4, 50.0, 20.0), Row("int4", 4, 80.0, 10.0)};
  const std::vector<BenchDecodeTarget> targets = Issue18DecodeTargets(rows);
  // No batch 16 rows: its river target is left out.
  ASSERT_EQ(targets.size(), 5u);
  EXPECT_EQ(targets[0].name, "full b1 effective");
  EXPECT_DOUBLE_EQ(targets[0].measured, 31.0);
  EXPECT_TRUE(targets[0].meets());  // >= 30 GB/s
  EXPECT_EQ(targets[1].name, "river / full b1");
  EXPECT_DOUBLE_EQ(targets[1].measured, 2.0);
  EXPECT_TRUE(targets[1].meets());  // >= 1.9x
  EXPECT_EQ(targets[2].name, "river / full b4");
  EXPECT_DOUBLE_EQ(targets[2].measured, 1.25);
  EXPECT_FALSE(targets[2].meets());  // < 1.4x
  EXPECT_EQ(targets[3].name, "int4 / full b1");
  EXPECT_FALSE(targets[3].meets());  // 2.6x < 2.7x
  EXPECT_EQ(targets[4].name, "int4 / full b4");
  EXPECT_DOUBLE_EQ(targets[4].measured, 2.0);
  EXPECT_TRUE(targets[4].meets());  // >= 1.5x
}

TEST(BenchDecodeTargetsTest, JsonAndTableCarryCeilingRowsAndVerdicts) {
  BenchDecodeReport report;
  report.threads = 2;
  report.weight_dtype = "bf16";
  report.stream.bytes = 4096;
  report.stream.variants = {{1, true, 0, 20e9}, {2, true, 2048, 40e9}};
  report.stream.best = report.stream.variants;
  report.rows = {Row("full", 1, 10.0, 20.0), Row("river", 1, 15.0, 12.0)};
  report.rows[0].ceiling_fraction = 0.5;
  report.targets = Issue18DecodeTargets(report.rows);

  const nlohmann::json json = nlohmann::json::parse(BenchDecodeJson(report));
  EXPECT_DOUBLE_EQ(json["stream_read_gbytes_per_second"].get<double>(), 40.0);
  EXPECT_EQ(json["ceiling_threads"], 2);
  EXPECT_DOUBLE_EQ(json["stream_read"]["one_thread_gbytes_per_second"].get<double>(), 20.0);
  EXPECT_EQ(json["stream_read"]["best"][1]["prefetch_bytes"], 2048);
  ASSERT_EQ(json["rows"].size(), 2u);
  EXPECT_DOUBLE_EQ(json["rows"][0]["effective_gbytes_per_second"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(json["rows"][1]["vs_full"].get<double>(), 1.5);
  ASSERT_EQ(json["targets"].size(), 2u);
  EXPECT_EQ(json["targets"][0]["meets"], false);  // 20 GB/s < 30
  EXPECT_EQ(json["targets"][1]["meets"], false);  // 1.5x < 1.9x

  const std::string table = BenchDecodeTable(report);
  EXPECT_NE(table.find("40.00 GB/s at 2 of 2 threads"), std::string::npos) << table;
  EXPECT_NE(table.find("1 thread :  20.00 GB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("misses"), std::string::npos) << table;
}

}  // namespace
}  // namespace estuary
