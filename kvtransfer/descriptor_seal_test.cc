// Sealed transfer descriptors (descriptor_seal.h): a descriptor verifies only as its decode worker
// sealed it, under the same key. Every value of every field (found by reflection, so a field
// added to the proto is covered here too), every bit of the wire form, another key, a missing or
// cut seal: refused. Prints what sealing and verifying cost ([figure]).

#include "kvtransfer/descriptor_seal.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace estuary::kvtransfer {
namespace {

namespace pb = ::google::protobuf;
namespace v1 = ::estuary::v1;
using ::testing::HasSubstr;

constexpr char kKey[] = "a 32-byte key derived elsewhere!";

// A descriptor shaped like a real one (UCX over tcp: a worker address of a few hundred bytes,
// rkeys of tens), with every field set.
v1::TransferDescriptor Sample(int layers = 3, int tp = 2, int pages = 4) {
  v1::TransferDescriptor d;
  d.set_transport("ucx");
  d.set_worker_address(std::string(220, 'w'));
  d.set_request_id("req-7f3a");
  for (int p = 0; p < pages; ++p) d.add_page_ids(100 + 3 * p);
  v1::KvLayoutSpec* layout = d.mutable_layout();
  layout->set_n_layers(layers);
  layout->set_n_kv_heads(8 / tp);
  layout->set_head_dim(64);
  layout->set_block_size(16);
  layout->set_dtype("f32");
  d.set_tp_size(tp);
  for (int r = 0; r < tp; ++r) {
    v1::KvRankRegions* rank = d.add_ranks();
    rank->set_tp_rank(r + 1);  // nonzero, so that a change of it is a change (checked elsewhere)
    rank->set_worker_address(absl::StrCat(std::string(200, 'r'), r));
    for (int l = 0; l < layers; ++l) {
      v1::KvRemoteRegion* region = rank->add_layers();
      region->set_base_address(0x7f0000000000ull + (uint64_t{1} << 24) * (r * layers + l));
      region->set_bytes(uint64_t{1} << 24);
      region->set_rkey(absl::StrCat(std::string(60, 'k'), r, "/", l));
    }
  }
  v1::KvFormatFingerprint* fingerprint = d.mutable_fingerprint();
  fingerprint->set_model_id("llama-3.2-1b");
  fingerprint->set_dtype("f32");
  *fingerprint->mutable_layout() = *layout;
  fingerprint->mutable_layout()->set_n_kv_heads(8);
  d.set_lease_deadline_unix_ms(1767225600000);
  d.set_reservation_epoch(0x9e3779b97f4a7c15ull);
  return d;
}

v1::TransferDescriptor Sealed(const v1::TransferDescriptor& d, const DescriptorSeal& seal) {
  v1::TransferDescriptor out = d;
  seal.Seal(&out);
  return out;
}

// Whether every field of `m` (but `skip`) is set: nonzero, non-empty, present; recursively.
void ExpectEveryFieldSet(const pb::Message& m, const pb::FieldDescriptor* skip,
                         const std::string& path) {
  const pb::Reflection& r = *m.GetReflection();
  const pb::Descriptor& type = *m.GetDescriptor();
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor* f = type.field(i);
    if (f == skip) continue;
    const std::string name = absl::StrCat(path, f->name());
    if (f->is_repeated()) {
      EXPECT_GT(r.FieldSize(m, f), 0) << name << " is empty in the sample: set it";
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && r.FieldSize(m, f) > 0) {
        ExpectEveryFieldSet(r.GetRepeatedMessage(m, f, 0), nullptr, name + "[0].");
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      EXPECT_TRUE(r.HasField(m, f)) << name << " is not set in the sample: set it";
      if (r.HasField(m, f)) ExpectEveryFieldSet(r.GetMessage(m, f), nullptr, name + ".");
    } else {
      EXPECT_TRUE(r.HasField(m, f)) << name << " is zero in the sample: set it";
    }
  }
}

// Flips the lowest bit of one value of `f` (element `index` of a repeated field, or the singular
// value for -1); false for a type this test does not know yet.
bool Flip(pb::Message* m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection& r = *m->GetReflection();
  const bool rep = index >= 0;
  using T = pb::FieldDescriptor;
  switch (f->cpp_type()) {
    case T::CPPTYPE_INT32:
      rep ? r.SetRepeatedInt32(m, f, index, r.GetRepeatedInt32(*m, f, index) ^ 1)
          : r.SetInt32(m, f, r.GetInt32(*m, f) ^ 1);
      return true;
    case T::CPPTYPE_INT64:
      rep ? r.SetRepeatedInt64(m, f, index, r.GetRepeatedInt64(*m, f, index) ^ 1)
          : r.SetInt64(m, f, r.GetInt64(*m, f) ^ 1);
      return true;
    case T::CPPTYPE_UINT32:
      rep ? r.SetRepeatedUInt32(m, f, index, r.GetRepeatedUInt32(*m, f, index) ^ 1)
          : r.SetUInt32(m, f, r.GetUInt32(*m, f) ^ 1);
      return true;
    case T::CPPTYPE_UINT64:
      rep ? r.SetRepeatedUInt64(m, f, index, r.GetRepeatedUInt64(*m, f, index) ^ 1)
          : r.SetUInt64(m, f, r.GetUInt64(*m, f) ^ 1);
      return true;
    case T::CPPTYPE_BOOL:
      rep ? r.SetRepeatedBool(m, f, index, !r.GetRepeatedBool(*m, f, index))
          : r.SetBool(m, f, !r.GetBool(*m, f));
      return true;
    case T::CPPTYPE_STRING: {
      std::string v = rep ? r.GetRepeatedString(*m, f, index) : r.GetString(*m, f);
      if (v.empty()) return false;
      v.back() = static_cast<char>(v.back() ^ 1);
      rep ? r.SetRepeatedString(m, f, index, v) : r.SetString(m, f, v);
      return true;
    }
    default:
      return false;
  }
}

// Calls `check(what)` once per change of `m` in place, restoring `m` after each: every scalar
// value (every element of a repeated field) with its lowest bit flipped, every string one byte
// shorter, every repeated field one element shorter, every message field cleared. `skip` is left
// alone.
void ForEachChange(pb::Message* m, const pb::FieldDescriptor* skip, const std::string& path,
                   const std::function<void(const std::string&)>& check) {
  std::unique_ptr<pb::Message> saved(m->New());
  saved->CopyFrom(*m);
  auto restore = [&] { m->CopyFrom(*saved); };
  const pb::Reflection& r = *m->GetReflection();
  const pb::Descriptor& type = *m->GetDescriptor();
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor* f = type.field(i);
    if (f == skip) continue;
    const std::string name = absl::StrCat(path, f->name());
    const bool message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (f->is_repeated()) {
      const int n = r.FieldSize(*m, f);
      for (int j = 0; j < n; ++j) {
        const std::string element = absl::StrCat(name, "[", j, "]");
        if (message) {
          ForEachChange(r.MutableRepeatedMessage(m, f, j), nullptr, element + ".", check);
        } else {
          ASSERT_TRUE(Flip(m, f, j)) << "the test cannot change " << element << " yet";
          check(element);
          restore();
        }
      }
      if (n > 0) {
        r.RemoveLast(m, f);
        check(name + " one shorter");
        restore();
      }
    } else if (message) {
      ForEachChange(r.MutableMessage(m, f), nullptr, name + ".", check);
      r.ClearField(m, f);
      check(name + " cleared");
      restore();
    } else {
      ASSERT_TRUE(Flip(m, f, -1)) << "the test cannot change " << name << " yet";
      check(name);
      restore();
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
        const std::string v = r.GetString(*m, f);
        r.SetString(m, f, v.substr(0, v.size() - 1));
        check(name + " one byte shorter");
        restore();
      }
    }
  }
}

const pb::FieldDescriptor* SealField() {
  return v1::TransferDescriptor::descriptor()->FindFieldByNumber(
      v1::TransferDescriptor::kSealFieldNumber);
}

TEST(DescriptorSealTest, ASealedDescriptorVerifies) {
  const DescriptorSeal seal(kKey);
  const v1::TransferDescriptor d = Sealed(Sample(), seal);
  EXPECT_EQ(d.seal().size(), kDescriptorSealBytes);
  EXPECT_TRUE(seal.Verify(d).ok()) << seal.Verify(d);
  // The wire form's round trip (the router parses and re-serializes it) keeps it valid.
  v1::TransferDescriptor back;
  ASSERT_TRUE(back.ParseFromString(d.SerializeAsString()));
  EXPECT_TRUE(seal.Verify(back).ok());
  // Sealing again gives the same seal (over the fields, not over the old seal).
  EXPECT_EQ(Sealed(d, seal).seal(), d.seal());
}

TEST(DescriptorSealTest, EveryFieldIsCoveredAndTheSampleSetsEveryField) {
  v1::TransferDescriptor d = Sample();
  ExpectEveryFieldSet(d, SealField(), "");
  const DescriptorSeal seal(kKey);
  seal.Seal(&d);
  const std::string digest = DescriptorDigest(d);
  int changes = 0;
  ForEachChange(&d, SealField(), "", [&](const std::string& what) {
    ++changes;
    const absl::Status verdict = seal.Verify(d);
    EXPECT_EQ(verdict.code(), absl::StatusCode::kUnauthenticated) << what << " changed: " << verdict;
    EXPECT_THAT(verdict.message(), HasSubstr("does not match")) << what;
    EXPECT_NE(DescriptorDigest(d), digest) << what << " changed but the digest did not";
  });
  EXPECT_GT(changes, 60);
  EXPECT_TRUE(seal.Verify(d).ok()) << "the walk did not restore the descriptor";
  EXPECT_EQ(DescriptorDigest(d), digest);
}

// Every single-bit flip of the wire form: what still parses and says something else (unknown
// fields aside, which nothing reads) is refused; what parses to the same fields verifies.
TEST(DescriptorSealTest, EveryBitFlipOfTheWireFormThatChangesAFieldIsRefused) {
  pb::LogSilencer quiet;  // protobuf would log every string that no longer is UTF-8
  const DescriptorSeal seal(kKey);
  const v1::TransferDescriptor d = Sealed(Sample(2, 1, 3), seal);
  const std::string wire = d.SerializeAsString();
  int unparsable = 0, refused = 0, same = 0;
  for (size_t bit = 0; bit < wire.size() * 8; ++bit) {
    std::string flipped = wire;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    v1::TransferDescriptor parsed;
    if (!parsed.ParseFromString(flipped)) {
      ++unparsable;
      continue;
    }
    parsed.GetReflection()->MutableUnknownFields(&parsed)->Clear();
    const bool changed = parsed.SerializeAsString() != wire;
    const absl::Status verdict = seal.Verify(parsed);
    if (changed) {
      ++refused;
      EXPECT_EQ(verdict.code(), absl::StatusCode::kUnauthenticated) << "bit " << bit;
    } else {
      ++same;
      EXPECT_TRUE(verdict.ok()) << "bit " << bit << ": " << verdict;
    }
  }
  std::printf("[figure] %zu single-bit flips of a sealed descriptor: %d unparsable, %d refused, "
              "%d parse to the same fields\n",
              wire.size() * 8, unparsable, refused, same);
  EXPECT_GT(refused, static_cast<int>(wire.size()));  // most flips land in some field
}

TEST(DescriptorSealTest, AnotherKeyAMissingOrCutSealAreRefused) {
  const DescriptorSeal seal(kKey);
  const v1::TransferDescriptor d = Sealed(Sample(), seal);
  const absl::Status other = DescriptorSeal("another cluster's key, 32 bytes!").Verify(d);
  EXPECT_EQ(other.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(other.message(), HasSubstr("another cluster token"));
  v1::TransferDescriptor bad = d;
  bad.clear_seal();
  const absl::Status missing = seal.Verify(bad);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("'req-7f3a' carries no seal"));
  bad.set_seal(d.seal().substr(0, 16));
  EXPECT_EQ(seal.Verify(bad).code(), absl::StatusCode::kUnauthenticated);
  bad.set_seal(d.seal() + "x");
  EXPECT_EQ(seal.Verify(bad).code(), absl::StatusCode::kUnauthenticated);
  // The key is not a prefix of anything: a longer or shorter key is another key.
  EXPECT_FALSE(DescriptorSeal(std::string(kKey) + "!").Verify(d).ok());
  EXPECT_FALSE(DescriptorSeal(std::string(kKey).substr(1)).Verify(d).ok());
}

// Without a key (a cluster without a token) nothing is sealed and nothing checked.
TEST(DescriptorSealTest, WithoutAKeyNothingIsSealedOrChecked) {
  const DescriptorSeal none = DescriptorSeal::None();
  EXPECT_FALSE(none.enabled());
  v1::TransferDescriptor d = Sealed(Sample(), DescriptorSeal(kKey));
  none.Seal(&d);
  EXPECT_TRUE(d.seal().empty());
  EXPECT_TRUE(none.Verify(d).ok());
  d.set_seal("anything");
  EXPECT_TRUE(none.Verify(d).ok());
}

TEST(DescriptorSealTest, TheDigestIsOfTheFieldsNotOfTheSeal) {
  const v1::TransferDescriptor d = Sample();
  const std::string digest = DescriptorDigest(d);
  EXPECT_EQ(digest.size(), kDescriptorDigestBytes);
  EXPECT_EQ(DescriptorDigest(Sealed(d, DescriptorSeal(kKey))), digest);
  v1::TransferDescriptor other = d;
  other.set_page_ids(0, other.page_ids(1));
  EXPECT_NE(DescriptorDigest(other), digest);
  // The canonical bytes are unambiguous: moving a byte from one string to the next changes them.
  v1::TransferDescriptor a = d, b = d;
  a.set_transport("uc");
  a.set_worker_address("x" + d.worker_address());
  b.set_transport("ucx");
  b.set_worker_address(d.worker_address());
  EXPECT_NE(CanonicalDescriptorBytes(a), CanonicalDescriptorBytes(b));
}

// What a request pays: the decode worker seals one descriptor, the prefill worker verifies it,
// and the decode worker digests it once more for the attach. A llama-3.2-1B-shaped descriptor
// (16 layers, TP 1 and 2, 64 pages: a 1,024-token prompt) and a stories260K one (5 layers, 1
// rank, 2 pages).
TEST(DescriptorSealTest, SealAndVerifyCostMicroseconds) {
  const DescriptorSeal seal(kKey);
  struct Shape {
    const char* name;
    int layers, tp, pages;
  };
  for (const Shape& shape : {Shape{"stories260K TP1, 2 pages", 5, 1, 2},
                             Shape{"llama-3.2-1B TP1, 64 pages", 16, 1, 64},
                             Shape{"llama-3.2-1B TP2, 64 pages", 16, 2, 64}}) {
    const v1::TransferDescriptor d = Sample(shape.layers, shape.tp, shape.pages);
    std::vector<double> seal_us, verify_us, digest_us;
    for (int i = 0; i < 201; ++i) {
      v1::TransferDescriptor copy = d;
      absl::Time start = absl::Now();
      seal.Seal(&copy);
      seal_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      start = absl::Now();
      const absl::Status verdict = seal.Verify(copy);
      verify_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      ASSERT_TRUE(verdict.ok());
      start = absl::Now();
      const std::string digest = DescriptorDigest(copy);
      digest_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      ASSERT_EQ(digest.size(), kDescriptorDigestBytes);
    }
    auto median = [](std::vector<double>& v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double s = median(seal_us), v = median(verify_us), g = median(digest_us);
    std::printf("[figure] descriptor %s (%zu canonical bytes): seal %.1f us, verify %.1f us, "
                "digest %.1f us (medians of 201)\n",
                shape.name, CanonicalDescriptorBytes(d).size(), s, v, g);
    // Far below a request's other costs (a Reserve round trip is ~1 ms) on any machine; a
    // regression to, e.g., a key schedule per field would show.
    EXPECT_LT(s + v + g, 2000.0) << shape.name;
  }
}

}  // namespace
}  // namespace estuary::kvtransfer
