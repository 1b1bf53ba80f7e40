#include "kvtransfer/fingerprint.h"

#include "gtest/gtest.h"

namespace estuary::kvtransfer {
namespace {

TEST(FingerprintTest, EqualFormatsMatch) {
  auto a = MakeFingerprint("llama-3.2-1b", 16, 8, 64, 16);
  auto b = MakeFingerprint("llama-3.2-1b", 16, 8, 64, 16);
  EXPECT_TRUE(CheckFingerprintsMatch(a, b).ok());
  EXPECT_EQ(FingerprintHash(a), FingerprintHash(b));
  EXPECT_EQ(FingerprintString(a),
            "model=llama-3.2-1b dtype=f32 layers=16 kv_heads=8 head_dim=64 block=16");
}

TEST(FingerprintTest, MismatchNamesBothSides) {
  auto local = MakeFingerprint("llama-3.2-1b", 16, 8, 64, 16);
  auto remote = MakeFingerprint("llama-3.2-1b", 16, 8, 64, 32);
  absl::Status s = CheckFingerprintsMatch(local, remote);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "KV format mismatch: local <model=llama-3.2-1b dtype=f32 layers=16 kv_heads=8 "
            "head_dim=64 block=16> vs remote <model=llama-3.2-1b dtype=f32 layers=16 kv_heads=8 "
            "head_dim=64 block=32>");
  EXPECT_NE(FingerprintHash(local), FingerprintHash(remote));
  EXPECT_FALSE(CheckFingerprintsMatch(local, MakeFingerprint("other", 16, 8, 64, 16)).ok());
  EXPECT_FALSE(CheckFingerprintsMatch(local, MakeFingerprint("llama-3.2-1b", 16, 8, 64, 16,
                                                             "bf16")).ok());
}

}  // namespace
}  // namespace estuary::kvtransfer
