#include "core/loader/llama2c_checkpoint.h"

#include <cstring>

#include "core/loader/test_util.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using testing_util::ModelDir;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

std::string Header(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv,
                   int32_t vocab, int32_t seq) {
  const int32_t fields[7] = {dim, hidden, layers, heads, kv, vocab, seq};
  return std::string(reinterpret_cast<const char*>(fields), sizeof(fields));
}

TEST(Llama2cCheckpointTest, LoadsStories260K) {
  const std::string path = ModelDir("stories260K") + "/model.bin";
  auto checkpoint = LoadLlama2cCheckpoint(path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const LlamaConfig& c = checkpoint->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(c.name, "stories260K");

  const LlamaWeights& w = checkpoint->weights;
  EXPECT_EQ(w.embedding.shape(), (Shape{512, 64}));
  EXPECT_EQ(w.embedding.dtype(), DType::kF32);
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.layers[4].wq.shape(), (Shape{64, 64}));
  EXPECT_EQ(w.layers[4].wk.shape(), (Shape{32, 64}));
  EXPECT_EQ(w.layers[4].wv.shape(), (Shape{32, 64}));
  EXPECT_EQ(w.layers[4].wo.shape(), (Shape{64, 64}));
  EXPECT_EQ(w.layers[4].w_gate.shape(), (Shape{172, 64}));
  EXPECT_EQ(w.layers[4].w_up.shape(), (Shape{172, 64}));
  EXPECT_EQ(w.layers[4].w_down.shape(), (Shape{64, 172}));
  EXPECT_EQ(w.layers[4].attn_norm.shape(), (Shape{64}));
  EXPECT_EQ(w.final_norm.shape(), (Shape{64}));
  EXPECT_EQ(w.lm_head.raw(), w.embedding.raw());  // tied: shared storage

  // The tensors view the file: spot-check values against the raw bytes.
  const std::string bytes = ReadAll(path);
  float first_embedding, first_attn_norm, final_norm0;
  std::memcpy(&first_embedding, bytes.data() + 28, 4);
  std::memcpy(&first_attn_norm, bytes.data() + 28 + 512 * 64 * 4, 4);
  const size_t rope_bytes = 2 * 512 * 4 * 4;
  std::memcpy(&final_norm0, bytes.data() + bytes.size() - rope_bytes - 64 * 4, 4);
  EXPECT_EQ(w.embedding.data<float>()[0], first_embedding);
  EXPECT_EQ(w.layers[0].attn_norm.data<float>()[0], first_attn_norm);
  EXPECT_EQ(w.final_norm.data<float>()[0], final_norm0);
}

TEST(Llama2cCheckpointTest, LoadsStories12L) {
  auto checkpoint = LoadLlama2cCheckpoint(ModelDir("stories12L") + "/model.bin");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const LlamaConfig& c = checkpoint->config;
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.hidden_dim, 352);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.name, "stories12L");
  EXPECT_EQ(checkpoint->weights.layers.size(), 12u);
  EXPECT_EQ(checkpoint->weights.layers[11].w_down.shape(), (Shape{128, 352}));
}

TEST(Llama2cCheckpointTest, WeightsOutliveTheCheckpointStruct) {
  Tensor embedding;
  {
    auto checkpoint = LoadLlama2cCheckpoint(ModelDir("stories260K") + "/model.bin");
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    embedding = checkpoint->weights.embedding;
  }
  // The mapping is kept alive by the tensor's buffer.
  volatile float sum = 0;
  for (int64_t i = 0; i < embedding.numel(); ++i) sum = sum + embedding.data<float>()[i];
  SUCCEED();
}

TEST(Llama2cCheckpointTest, TruncatedFileIsNamed) {
  const auto dir = TestDir();
  const std::string bytes = ReadAll(ModelDir("stories260K") + "/model.bin");
  const std::string path = (dir / "model.bin").string();
  WriteAll(path, bytes.substr(0, 1000));
  auto checkpoint = LoadLlama2cCheckpoint(path);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(checkpoint.status().message().find("model.bin: file is 1000 bytes, header implies "
                                               "1056540"),
            absl::string_view::npos)
      << checkpoint.status();
}

TEST(Llama2cCheckpointTest, ExtraBytesAreRejected) {
  const auto dir = TestDir();
  const std::string path = (dir / "model.bin").string();
  WriteAll(path, ReadAll(ModelDir("stories260K") + "/model.bin") + "junk");
  auto checkpoint = LoadLlama2cCheckpoint(path);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss) << checkpoint.status();
}

TEST(Llama2cCheckpointTest, ShorterThanHeader) {
  const auto dir = TestDir();
  const std::string path = (dir / "model.bin").string();
  WriteAll(path, "abc");
  auto checkpoint = LoadLlama2cCheckpoint(path);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(checkpoint.status().message().find("3 bytes"), absl::string_view::npos);
}

TEST(Llama2cCheckpointTest, MissingFileIsNotFound) {
  auto checkpoint = LoadLlama2cCheckpoint("/nonexistent/model.bin");
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
}

struct BadHeader {
  const char* label;
  std::string header;
  const char* field;
};

TEST(Llama2cCheckpointTest, BadHeadersNameTheField) {
  const BadHeader cases[] = {
      {"negative dim", Header(-64, 172, 5, 8, 4, 512, 512), "dim = -64"},
      {"zero heads", Header(64, 172, 5, 0, 4, 512, 512), "n_heads = 0"},
      {"huge layers", Header(64, 172, 1 << 30, 8, 4, 512, 512), "n_layers"},
      {"huge vocab", Header(64, 172, 5, 8, 4, 1 << 30, 512), "vocab_size"},
      {"int min vocab", Header(64, 172, 5, 8, 4, INT32_MIN, 512), "vocab_size"},
      {"huge hidden", Header(64, 0x7fffffff, 5, 8, 4, 512, 512), "hidden_dim"},
      {"negative seq", Header(64, 172, 5, 8, 4, 512, -1), "max_seq_len"},
      {"kv not dividing", Header(64, 172, 5, 8, 3, 512, 512), "n_kv_heads = 3"},
      {"dim not divisible", Header(64, 172, 5, 7, 7, 512, 512), "not a multiple of n_heads = 7"},
  };
  const auto dir = TestDir();
  const std::string path = (dir / "model.bin").string();
  for (const BadHeader& c : cases) {
    WriteAll(path, c.header);
    auto checkpoint = LoadLlama2cCheckpoint(path);
    ASSERT_FALSE(checkpoint.ok()) << c.label;
    EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_NE(checkpoint.status().message().find(c.field), absl::string_view::npos)
        << c.label << ": " << checkpoint.status();
    EXPECT_NE(checkpoint.status().message().find("model.bin"), absl::string_view::npos);
  }
}

TEST(Llama2cCheckpointTest, NegativeVocabMeansUntiedClassifier) {
  const auto dir = TestDir();
  std::string bytes = ReadAll(ModelDir("stories260K") + "/model.bin");
  const int32_t negative_vocab = -512;
  std::memcpy(bytes.data() + 5 * 4, &negative_vocab, 4);
  std::string wcls(512 * 64 * 4, '\0');
  for (size_t i = 0; i < 512 * 64; ++i) {
    const float value = static_cast<float>(i % 97) * 0.25f;
    std::memcpy(wcls.data() + i * 4, &value, 4);
  }
  const std::string path = (dir / "model.bin").string();
  WriteAll(path, bytes + wcls);
  auto checkpoint = LoadLlama2cCheckpoint(path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_FALSE(checkpoint->config.tied_embeddings);
  EXPECT_EQ(checkpoint->config.vocab_size, 512);
  const Tensor& head = checkpoint->weights.lm_head;
  EXPECT_EQ(head.shape(), (Shape{512, 64}));
  EXPECT_NE(head.raw(), checkpoint->weights.embedding.raw());
  EXPECT_EQ(head.data<float>()[98], 0.25f);

  // Without the classifier the untied file is too short.
  WriteAll(path, bytes);
  EXPECT_EQ(LoadLlama2cCheckpoint(path).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace estuary
