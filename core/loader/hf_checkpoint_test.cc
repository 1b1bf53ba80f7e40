#include "core/loader/hf_checkpoint.h"

#include <cmath>
#include <cstring>

#include "core/loader/hf_config.h"
#include "core/loader/hf_tensor_names.h"
#include "core/loader/hf_writer.h"
#include "core/loader/llama2c_checkpoint.h"
#include "core/loader/rope_permute.h"
#include "core/loader/safetensors.h"
#include "core/loader/test_util.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using testing_util::ModelDir;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void ExpectSameConfig(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.enabled, b.rope_scaling.enabled);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
  EXPECT_EQ(a.name, b.name);
}

// Converts stories260K into `dir`/stories260K (same folder name, so config names match).
std::string ConvertStories(const fs::path& dir, DType dtype) {
  const std::string out = (dir / "stories260K").string();
  const absl::Status status = ConvertLlama2cToHf(ModelDir("stories260K"), out, dtype);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(HfCheckpointTest, ConvertedLlama2cRoundTrips) {
  const auto dir = TestDir();
  const std::string out = ConvertStories(dir, DType::kF32);
  for (const char* file :
       {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / file)) << file;
  }
  auto original = LoadLlama2cCheckpoint(ModelDir("stories260K") + "/model.bin");
  ASSERT_TRUE(original.ok()) << original.status();
  std::vector<LoadProgress> reports;
  auto hf = LoadHfCheckpoint(out, [&](const LoadProgress& p) { reports.push_back(p); });
  ASSERT_TRUE(hf.ok()) << hf.status();

  LlamaConfig expected = original->config;
  expected.rope_style = RopeStyle::kHalves;
  ExpectSameConfig(hf->config, expected);
  EXPECT_EQ(hf->config.rope_style, RopeStyle::kHalves);

  const int hd = expected.head_dim;
  for (const HfTensorInfo& info : HfLlamaTensors(expected)) {
    const Tensor& got = WeightSlot(hf->weights, info);
    const Tensor& want = WeightSlot(original->weights, info);
    if (info.role == WeightRole::kWq || info.role == WeightRole::kWk) {
      EXPECT_FALSE(SameBytes(got, want)) << info.name << " should be permuted";
      auto unpermuted = HalvesToInterleavedRows(got, hd);
      ASSERT_TRUE(unpermuted.ok());
      EXPECT_TRUE(SameBytes(*unpermuted, want)) << info.name;
    } else {
      EXPECT_TRUE(SameBytes(got, want)) << info.name;
    }
  }
  EXPECT_EQ(hf->weights.lm_head.raw(), hf->weights.embedding.raw());  // tied

  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_GT(reports.back().bytes_total, 1'000'000);
  EXPECT_EQ(reports.back().bytes_done, reports.back().bytes_total);

  auto tokenizer = LoadHfTokenizer((fs::path(out) / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 512);
  EXPECT_EQ((*tokenizer)->bos_id(), 1);

  // Tied: no lm_head in the file.
  const std::string safetensors = ReadAll(fs::path(out) / "model.safetensors");
  EXPECT_EQ(safetensors.find("lm_head"), std::string::npos);
}

TEST(HfCheckpointTest, PermutationMatchesHalvesConvention) {
  // One head of 4 rows: interleaved rows (r0, r1, r2, r3) = pairs (r0,r1), (r2,r3) become halves
  // (r0, r2 | r1, r3).
  auto w = Tensor::Zeros(DType::kF32, {4, 1});
  ASSERT_TRUE(w.ok());
  for (int i = 0; i < 4; ++i) w->mutable_data<float>()[i] = static_cast<float>(i);
  auto halves = InterleavedToHalvesRows(*w, 4);
  ASSERT_TRUE(halves.ok());
  EXPECT_EQ(halves->data<float>()[0], 0.0f);
  EXPECT_EQ(halves->data<float>()[1], 2.0f);
  EXPECT_EQ(halves->data<float>()[2], 1.0f);
  EXPECT_EQ(halves->data<float>()[3], 3.0f);
  EXPECT_FALSE(InterleavedToHalvesRows(*w, 3).ok());
}

TEST(HfCheckpointTest, ConvertToBf16) {
  const auto dir = TestDir();
  const std::string out = ConvertStories(dir, DType::kBF16);
  auto original = LoadLlama2cCheckpoint(ModelDir("stories260K") + "/model.bin");
  auto hf = LoadHfCheckpoint(out);
  ASSERT_TRUE(original.ok() && hf.ok()) << hf.status();
  EXPECT_NE(ReadAll(fs::path(out) / "config.json").find("\"bfloat16\""), std::string::npos);
  EXPECT_EQ(hf->weights.layers[2].w_up.dtype(), DType::kBF16);
  auto want = ConvertDType(original->weights.layers[2].w_up, DType::kBF16);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(SameBytes(hf->weights.layers[2].w_up, *want));
}

// Rewrites `dir`/model.safetensors from `checkpoint` with `edit` applied to the tensor list.
void Rewrite(const std::string& dir, const LlamaCheckpoint& checkpoint,
             const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const HfTensorInfo& info : HfLlamaTensors(checkpoint.config)) {
    tensors.emplace_back(info.name, WeightSlot(checkpoint.weights, info));
  }
  edit(tensors);
  ASSERT_TRUE(WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors, {}).ok());
}

TEST(HfCheckpointTest, MissingTensorIsNamed) {
  const auto dir = TestDir();
  const std::string out = ConvertStories(dir, DType::kF32);
  auto hf = LoadHfCheckpoint(out);
  ASSERT_TRUE(hf.ok()) << hf.status();
  Rewrite(out, *hf, [](auto& tensors) {
    std::erase_if(tensors,
                  [](const auto& t) { return t.first == "model.layers.3.mlp.up_proj.weight"; });
  });
  auto broken = LoadHfCheckpoint(out);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("no tensor 'model.layers.3.mlp.up_proj.weight'"),
            absl::string_view::npos)
      << broken.status();
}

TEST(HfCheckpointTest, WrongShapeIsNamed) {
  const auto dir = TestDir();
  const std::string out = ConvertStories(dir, DType::kF32);
  auto hf = LoadHfCheckpoint(out);
  ASSERT_TRUE(hf.ok()) << hf.status();
  Rewrite(out, *hf, [](auto& tensors) {
    for (auto& [name, tensor] : tensors) {
      if (name == "model.layers.0.self_attn.k_proj.weight")
        tensor = *Tensor::Zeros(DType::kF32, {64, 64});
    }
  });
  auto broken = LoadHfCheckpoint(out);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("tensor 'model.layers.0.self_attn.k_proj.weight' has "
                                           "shape [64, 64], expected [32, 64]"),
            absl::string_view::npos)
      << broken.status();
}

TEST(HfCheckpointTest, ShardedIndex) {
  const auto dir = TestDir();
  const std::string out = ConvertStories(dir, DType::kF32);
  auto hf = LoadHfCheckpoint(out);
  ASSERT_TRUE(hf.ok()) << hf.status();
  // Two shards: the embedding alone, everything else in the second.
  std::vector<std::pair<std::string, Tensor>> first, second;
  nlohmann::json weight_map;
  for (const HfTensorInfo& info : HfLlamaTensors(hf->config)) {
    const bool in_first = info.role == WeightRole::kEmbedding;
    (in_first ? first : second).emplace_back(info.name, WeightSlot(hf->weights, info));
    weight_map[info.name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(
      WriteSafetensors((fs::path(out) / "model-00001-of-00002.safetensors").string(), first, {})
          .ok());
  ASSERT_TRUE(
      WriteSafetensors((fs::path(out) / "model-00002-of-00002.safetensors").string(), second, {})
          .ok());
  fs::remove(fs::path(out) / "model.safetensors");
  const fs::path index = fs::path(out) / "model.safetensors.index.json";
  WriteAll(index,
           nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  auto sharded = LoadHfCheckpoint(out);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_TRUE(SameBytes(sharded->weights.embedding, hf->weights.embedding));
  EXPECT_TRUE(SameBytes(sharded->weights.layers[4].w_down, hf->weights.layers[4].w_down));

  // A shard outside the folder is refused before anything is opened.
  for (const char* evil : {"../evil", "/etc/passwd", "sub/x.safetensors", ".."}) {
    nlohmann::json bad = weight_map;
    bad["model.norm.weight"] = evil;
    WriteAll(index, nlohmann::json{{"weight_map", bad}}.dump());
    auto refused = LoadHfCheckpoint(out);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << evil;
    EXPECT_NE(refused.status().message().find("not a plain file name"), absl::string_view::npos)
        << refused.status();
  }

  // A tensor the index promises but the shard lacks.
  nlohmann::json moved = weight_map;
  moved["model.norm.weight"] = "model-00001-of-00002.safetensors";
  WriteAll(index, nlohmann::json{{"weight_map", moved}}.dump());
  auto missing = LoadHfCheckpoint(out);
  EXPECT_NE(missing.status().message().find("model-00001-of-00002.safetensors: checkpoint has no "
                                            "tensor 'model.norm.weight'"),
            absl::string_view::npos)
      << missing.status();
}

TEST(HfCheckpointTest, MissingWeightsFile) {
  const auto dir = TestDir();
  LlamaConfig config;
  config.dim = 64;
  config.hidden_dim = 128;
  config.n_layers = 1;
  config.n_heads = 4;
  config.n_kv_heads = 4;
  config.head_dim = 16;
  config.vocab_size = 32;
  config.max_seq_len = 64;
  ASSERT_TRUE(WriteHfConfig(dir.string(), config, DType::kF32).ok());
  EXPECT_EQ(LoadHfCheckpoint(dir.string()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadHfCheckpoint((dir / "nope").string()).status().code(), absl::StatusCode::kNotFound);
}

TEST(HfConfigTest, Llama31ConfigRoundTrips) {
  LlamaConfig c;
  c.dim = 4096;
  c.hidden_dim = 14336;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.max_seq_len = 131072;
  c.rms_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {true, 8.0f, 1.0f, 4.0f, 8192};
  c.tied_embeddings = false;
  c.bos_id = 128000;
  c.eos_ids = {128001, 128008, 128009};
  const std::string json = HfConfigJson(c, DType::kBF16);
  EXPECT_NE(json.find("\"rms_norm_eps\": 1e-05"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rope_type\": \"llama3\""), std::string::npos) << json;
  auto parsed = ParseHfConfigJson(json, "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameConfig(*parsed, c);
  EXPECT_TRUE(parsed->Validate().ok());
}

TEST(HfConfigTest, DefaultsAndGenerationConfig) {
  auto c = ParseHfConfigJson(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,
      "max_position_embeddings":256,"eos_token_id":[5,6]})",
                             "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rms_eps, 1e-6f);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_FALSE(c->tied_embeddings);
  EXPECT_EQ(c->bos_id, 1);
  EXPECT_EQ(c->eos_ids, (std::vector<int>{5, 6}));
  ASSERT_TRUE(ApplyHfGenerationConfigJson(R"({"bos_token_id":3,"eos_token_id":7})",
                                          "generation_config.json", *c)
                  .ok());
  EXPECT_EQ(c->bos_id, 3);
  EXPECT_EQ(c->eos_ids, std::vector<int>{7});
}

TEST(HfConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* json;
    absl::StatusCode code;
    const char* substring;
  };
  const Case cases[] = {
      {R"({"model_type":"mistral"})", absl::StatusCode::kUnimplemented, "not a Llama model"},
      {R"({"model_type":"llama"})", absl::StatusCode::kInvalidArgument,
       "\"hidden_size\" is missing"},
      {R"({"model_type":"llama","hidden_size":"64"})", absl::StatusCode::kInvalidArgument,
       "\"hidden_size\" is not an integer"},
      {R"({"model_type":"llama","hidden_size":1e30})", absl::StatusCode::kInvalidArgument,
       "\"hidden_size\""},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
          "num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256,
          "rope_scaling":{"rope_type":"yarn","factor":4}})",
       absl::StatusCode::kUnimplemented, "rope_scaling type 'yarn'"},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
          "num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256,
          "rope_scaling":{"type":"llama3"}})",
       absl::StatusCode::kInvalidArgument, "\"factor\" is missing"},
      {"[1,2]", absl::StatusCode::kInvalidArgument, "not a JSON object"},
      {"{", absl::StatusCode::kInvalidArgument, "not valid UTF-8 JSON"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseHfConfigJson(c.json, "config.json");
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    EXPECT_NE(parsed.status().message().find(c.substring), absl::string_view::npos)
        << parsed.status();
  }
}

TEST(HfCheckpointTest, ConfigFileIsCapped) {
  const auto dir = TestDir();
  WriteAll(dir / "config.json", "{\"model_type\":\"llama\"," + std::string(2 << 20, ' ') + "}");
  auto loaded = LoadHfCheckpoint(dir.string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("config.json"), absl::string_view::npos);
}

TEST(HfCheckpointTest, ConfigValidationNamesTheFile) {
  const auto dir = TestDir();
  WriteAll(dir / "config.json", R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3,"vocab_size":100,
      "max_position_embeddings":256})");
  auto loaded = LoadHfCheckpoint(dir.string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("config.json: model config: n_heads = 4"),
            absl::string_view::npos)
      << loaded.status();
}

TEST(SynthesizeModelTest, TinyLoadsBack) {
  const auto dir = TestDir();
  const std::string out = (dir / "tiny").string();
  ASSERT_TRUE(SynthesizeModel("tiny", out, 42).ok());
  for (const char* file :
       {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / file)) << file;
  }
  auto hf = LoadHfCheckpoint(out);
  ASSERT_TRUE(hf.ok()) << hf.status();
  const LlamaConfig& c = hf->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(hf->weights.embedding.dtype(), DType::kBF16);
  EXPECT_EQ(hf->weights.final_norm.dtype(), DType::kBF16);
  EXPECT_EQ(ElementAsF32(hf->weights.layers[1].ffn_norm, 17), 1.0f);
  auto tokenizer = LoadHfTokenizer((fs::path(out) / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->bos_id(), c.bos_id);
  EXPECT_NE(hf->weights.lm_head.raw(), hf->weights.embedding.raw());  // tiny is untied

  // Roughly N(0, 1/fan_in): check the spread of a matrix.
  const Tensor& w = hf->weights.layers[0].w_down;  // fan_in 172
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float v = ElementAsF32(w, i);
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += double(v) * v;
  }
  const double mean = sum / w.numel();
  const double stddev = std::sqrt(sum_sq / w.numel() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(stddev, 1.0 / std::sqrt(172.0), 0.01);

  // Deterministic for a seed, different across seeds.
  const std::string again = (dir / "tiny2").string();
  const std::string other = (dir / "tiny3").string();
  ASSERT_TRUE(SynthesizeModel("tiny", again, 42).ok());
  ASSERT_TRUE(SynthesizeModel("tiny", other, 43).ok());
  EXPECT_EQ(ReadAll(fs::path(out) / "model.safetensors"),
            ReadAll(fs::path(again) / "model.safetensors"));
  EXPECT_NE(ReadAll(fs::path(out) / "model.safetensors"),
            ReadAll(fs::path(other) / "model.safetensors"));
}

TEST(SynthesizeModelTest, UnknownPresetListsValidOnes) {
  const auto dir = TestDir();
  const absl::Status status = SynthesizeModel("llama-9", (dir / "x").string(), 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tiny, small, llama-3.2-1b, llama-1b-v512, llama-3.1-8b"), absl::string_view::npos);
  EXPECT_FALSE(fs::exists(dir / "x"));
}

}  // namespace
}  // namespace estuary
