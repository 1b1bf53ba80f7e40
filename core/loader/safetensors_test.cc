#include "core/loader/safetensors.h"

#include <cstring>

#include "core/common/mapped_file.h"
#include "core/loader/safetensors_writer.h"
#include "core/loader/test_util.h"
#include "core/tensor/half_float.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using testing_util::TestDir;
using testing_util::WriteAll;

// A safetensors file: length prefix, `header`, then `data_bytes` bytes of data.
std::string File(const std::string& header, size_t data_bytes, uint64_t claimed_length = 0) {
  const uint64_t length = claimed_length ? claimed_length : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(length >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& bytes) {
  return ParseSafetensorsHeader(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "model.safetensors");
}

void ExpectError(const std::string& bytes, absl::StatusCode code, const std::string& substring) {
  auto header = Parse(bytes);
  ASSERT_FALSE(header.ok()) << "expected an error containing: " << substring;
  EXPECT_EQ(header.status().code(), code) << header.status();
  EXPECT_NE(header.status().message().find(substring), absl::string_view::npos) << header.status();
  EXPECT_NE(header.status().message().find("model.safetensors"), absl::string_view::npos);
}

TEST(SafetensorsParseTest, ValidHeader) {
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
                           R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                           R"("c":{"dtype":"I64","shape":[],"data_offsets":[28,36]}})";
  auto header = Parse(File(json, 36));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->data_start, 8 + json.size());
  EXPECT_EQ(header->metadata.at("format"), "pt");
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "a");  // data order
  EXPECT_EQ(header->tensors[0].dtype, DType::kF32);
  EXPECT_TRUE(header->tensors[0].loadable);
  EXPECT_EQ(header->tensors[1].name, "b");
  EXPECT_EQ(header->tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(header->tensors[1].shape, (Shape{2, 3}));
  EXPECT_EQ(header->tensors[1].begin, 16u);
  EXPECT_EQ(header->tensors[1].end, 28u);
  EXPECT_EQ(header->tensors[2].dtype_name, "I64");
  EXPECT_FALSE(header->tensors[2].loadable);
}

TEST(SafetensorsParseTest, EmptyHeaderAndPadding) {
  auto header = Parse(File("{}      ", 0));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(header->tensors.empty());
}

TEST(SafetensorsParseTest, TruncatedFile) {
  ExpectError(std::string("\x10\x00\x00", 3), absl::StatusCode::kDataLoss, "too short");
}

TEST(SafetensorsParseTest, HeaderLengthBeyondFile) {
  ExpectError(File("{}", 0, /*claimed_length=*/4096), absl::StatusCode::kDataLoss,
              "header length 4096 runs past the end");
}

TEST(SafetensorsParseTest, HeaderOverLimit) {
  ExpectError(File("{}", 0, /*claimed_length=*/200'000'000), absl::StatusCode::kInvalidArgument,
              "exceeds the limit");
  ExpectError(File("{}", 0, /*claimed_length=*/~uint64_t{0}), absl::StatusCode::kInvalidArgument,
              "exceeds the limit");
}

TEST(SafetensorsParseTest, FirstByteNotBrace) {
  ExpectError(File(" {}", 0), absl::StatusCode::kInvalidArgument, "does not start with '{'");
  ExpectError(File("", 0), absl::StatusCode::kInvalidArgument, "does not start with '{'");
}

TEST(SafetensorsParseTest, BadJson) {
  ExpectError(File(R"({"a": )", 0), absl::StatusCode::kInvalidArgument, "not valid UTF-8 JSON");
  ExpectError(File("{\"\xff\":1}", 0), absl::StatusCode::kInvalidArgument, "not valid UTF-8 JSON");
  ExpectError(File(R"({"a": 5})", 0), absl::StatusCode::kInvalidArgument,
              "tensor 'a': entry is not a JSON object");
}

TEST(SafetensorsParseTest, DeepNesting) {
  ExpectError(File("{\"a\":" + std::string(10000, '['), 0), absl::StatusCode::kInvalidArgument,
              "nests deeper");
}

TEST(SafetensorsParseTest, UnknownDtype) {
  ExpectError(File(R"({"x":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1),
              absl::StatusCode::kInvalidArgument, "tensor 'x': unknown dtype 'F7'");
}

TEST(SafetensorsParseTest, MissingFields) {
  ExpectError(File(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4),
              absl::StatusCode::kInvalidArgument, "\"dtype\"");
  ExpectError(File(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", 4),
              absl::StatusCode::kInvalidArgument, "\"shape\"");
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
              absl::StatusCode::kInvalidArgument, "\"data_offsets\"");
}

TEST(SafetensorsParseTest, SizeMismatch) {
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
              absl::StatusCode::kInvalidArgument,
              "model.safetensors: tensor 'x': data_offsets [0, 12] but shape [2, 2] of F32 "
              "needs 16 bytes");
}

TEST(SafetensorsParseTest, OffsetsBeyondData) {
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
              absl::StatusCode::kDataLoss, "tensor 'x': data_offsets [0, 16] run past the end");
}

TEST(SafetensorsParseTest, BeginAfterEnd) {
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
              absl::StatusCode::kInvalidArgument, "end before they begin");
}

TEST(SafetensorsParseTest, OverlappingTensors) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                   R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                   24),
              absl::StatusCode::kInvalidArgument,
              "tensor 'b': data_offsets [8, 24] overlap "
              "tensor 'a'");
}

TEST(SafetensorsParseTest, GapAndUncoveredData) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                   R"("b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}})",
                   36),
              absl::StatusCode::kInvalidArgument, "gap");
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 20),
              absl::StatusCode::kInvalidArgument,
              "data region is 20 bytes but the tensors cover 16");
}

TEST(SafetensorsParseTest, NegativeShape) {
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0),
              absl::StatusCode::kInvalidArgument,
              "tensor 'x': shape [-1,4] has an entry that is "
              "not a non-negative integer");
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", 0),
              absl::StatusCode::kInvalidArgument, "not a non-negative integer");
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 0),
              absl::StatusCode::kInvalidArgument, "are not non-negative integers");
}

TEST(SafetensorsParseTest, OverflowingShape) {
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                   R"("data_offsets":[0,0]}})",
                   0),
              absl::StatusCode::kInvalidArgument,
              "tensor 'x': shape [4294967296, 4294967296, "
              "4294967296] overflows");
  ExpectError(File(R"({"x":{"dtype":"F32","shape":[18446744073709551615],)"
                   R"("data_offsets":[0,0]}})",
                   0),
              absl::StatusCode::kInvalidArgument, "overflows");
  // numel fits but numel * 8 bytes would not fit 2^64 without the cap.
  ExpectError(File(R"({"x":{"dtype":"F64","shape":[2305843009213693952,4],)"
                   R"("data_offsets":[0,0]}})",
                   0),
              absl::StatusCode::kInvalidArgument, "overflows");
}

TEST(SafetensorsParseTest, RankLimit) {
  ExpectError(File(R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
              absl::StatusCode::kInvalidArgument, "rank 9");
}

TEST(SafetensorsParseTest, DuplicateName) {
  ExpectError(File(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                   R"("x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                   2),
              absl::StatusCode::kInvalidArgument, "duplicate key 'x'");
}

TEST(SafetensorsParseTest, MetadataMustBeStrings) {
  ExpectError(File(R"({"__metadata__":{"n":1}})", 0), absl::StatusCode::kInvalidArgument,
              "__metadata__ value for 'n' is not a string");
  ExpectError(File(R"({"__metadata__":[]})", 0), absl::StatusCode::kInvalidArgument,
              "__metadata__ is not a JSON object");
}

TEST(SafetensorsParseTest, HostileNamesAreEscapedAndBounded) {
  const std::string name = "\\n" + std::string(5000, 'z');
  auto header = Parse(File("{\"" + name + "\":5}", 0));
  ASSERT_FALSE(header.ok());
  EXPECT_LT(header.status().message().size(), 400u);
}

// Writer -> file -> parser -> tensors.
TEST(SafetensorsRoundTripTest, WriteThenRead) {
  const auto dir = TestDir();
  const std::string path = (dir / "model.safetensors").string();
  auto f32 = Tensor::Zeros(DType::kF32, {3, 5});
  auto bf16 = Tensor::Zeros(DType::kBF16, {7});
  auto f16 = Tensor::Zeros(DType::kF16, {2, 1, 3});
  ASSERT_TRUE(f32.ok() && bf16.ok() && f16.ok());
  for (int i = 0; i < 15; ++i) f32->mutable_data<float>()[i] = 0.5f * i - 3.0f;
  for (int i = 0; i < 7; ++i) bf16->mutable_data<uint16_t>()[i] = F32ToBf16(1.0f + i);
  for (int i = 0; i < 6; ++i) f16->mutable_data<uint16_t>()[i] = F32ToF16(-0.25f * i);
  ASSERT_TRUE(WriteSafetensors(path, {{"w.f32", *f32}, {"w.bf16", *bf16}, {"w.f16", *f16}},
                               {{"format", "pt"}, {"note", "hi"}})
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto header = ParseSafetensorsHeader(absl::MakeConstSpan((*file)->data(), (*file)->size()), path);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->data_start % 8, 0u);
  EXPECT_EQ(header->metadata.size(), 2u);
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "w.f32");  // written in order
  EXPECT_EQ(header->tensors[1].name, "w.bf16");
  EXPECT_EQ(header->tensors[2].name, "w.f16");
  const Tensor* originals[] = {&*f32, &*bf16, &*f16};
  for (size_t t = 0; t < 3; ++t) {
    auto tensor = SafetensorsTensor(*file, *header, header->tensors[t]);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_EQ(tensor->dtype(), originals[t]->dtype());
    EXPECT_EQ(tensor->shape(), originals[t]->shape());
    EXPECT_EQ(std::memcmp(tensor->raw(), originals[t]->raw(), tensor->nbytes()), 0);
    // Zero-copy: the tensor points into the mapping.
    const auto* p = static_cast<const uint8_t*>(tensor->raw());
    EXPECT_GE(p, (*file)->data());
    EXPECT_LE(p + tensor->nbytes(), (*file)->data() + (*file)->size());
  }
}

TEST(SafetensorsRoundTripTest, MisalignedDataIsCopied) {
  const auto dir = TestDir();
  const std::string path = (dir / "odd.safetensors").string();
  // Header of 61 bytes: the data starts at 69, not a multiple of 4.
  std::string json = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  json.append(61 - json.size(), ' ');
  std::string bytes = File(json, 0);
  const float values[2] = {1.5f, -2.25f};
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  WriteAll(path, bytes);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto header = ParseSafetensorsHeader(absl::MakeConstSpan((*file)->data(), (*file)->size()), path);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->data_start, 69u);
  auto tensor = SafetensorsTensor(*file, *header, header->tensors[0]);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor->raw()) % 4, 0u);
  EXPECT_EQ(tensor->data<float>()[0], 1.5f);
  EXPECT_EQ(tensor->data<float>()[1], -2.25f);
  // The loader's own copy: the model loader leaves it where it is (no second copy).
  EXPECT_FALSE(tensor->in_file_mapping());
}

TEST(SafetensorsRoundTripTest, UnsupportedDtypeIsReportedAtLoad) {
  const auto dir = TestDir();
  const std::string path = (dir / "ints.safetensors").string();
  WriteAll(path, File(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto header = ParseSafetensorsHeader(absl::MakeConstSpan((*file)->data(), (*file)->size()), path);
  ASSERT_TRUE(header.ok()) << header.status();
  auto tensor = SafetensorsTensor(*file, *header, header->tensors[0]);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(tensor.status().message().find("tensor 'ids' has dtype I64"), absl::string_view::npos)
      << tensor.status();
}

TEST(SafetensorsWriterTest, IncompleteWriteLeavesNoFile) {
  const auto dir = TestDir();
  const std::string path = (dir / "partial.safetensors").string();
  {
    auto writer = SafetensorsStreamWriter::Create(path, {{"a", DType::kF32, {4}}}, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    const uint8_t bytes[8] = {};
    ASSERT_TRUE((*writer)->Append(bytes).ok());
    EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
    const uint8_t too_many[12] = {};
    EXPECT_EQ((*writer)->Append(too_many).code(), absl::StatusCode::kOutOfRange);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsWriterTest, RejectsBadSpecs) {
  const auto dir = TestDir();
  const std::string path = (dir / "bad.safetensors").string();
  EXPECT_FALSE(
      SafetensorsStreamWriter::Create(path, {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}, {})
          .ok());
  EXPECT_FALSE(
      SafetensorsStreamWriter::Create(path, {{"__metadata__", DType::kF32, {1}}}, {}).ok());
  EXPECT_FALSE(SafetensorsStreamWriter::Create(path, {{"q", DType::kInt4, {2}}}, {}).ok());
}

}  // namespace
}  // namespace estuary
