#include "core/loader/hf_config.h"

#include <charconv>
#include <filesystem>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

class Fields {
 public:
  Fields(const Json& object, absl::string_view file) : object_(object), file_(file) {}

  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": \"", field, "\" ", what));
  }

  const Json* Find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  // An integer field in int32 range (integral floats such as 2048.0 are accepted).
  absl::StatusOr<std::optional<int>> Int(const char* key) const {
    const Json* value = Find(key);
    if (value == nullptr) return std::optional<int>();
    return ToInt(*value, key);
  }
  absl::StatusOr<int> RequiredInt(const char* key) const {
    ESTUARY_ASSIGN_OR_RETURN(std::optional<int> value, Int(key));
    if (!value.has_value()) return Error(key, "is missing");
    return *value;
  }
  absl::StatusOr<int> IntOr(const char* key, int fallback) const {
    ESTUARY_ASSIGN_OR_RETURN(std::optional<int> value, Int(key));
    return value.value_or(fallback);
  }
  absl::StatusOr<float> FloatOr(const char* key, float fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number()) return Error(key, "is not a number");
    const double d = value->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
      return Error(key, "is out of range");
    }
    return static_cast<float>(d);
  }
  absl::StatusOr<bool> BoolOr(const char* key, bool fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) return Error(key, "is not a boolean");
    return value->get<bool>();
  }
  // An int or a list of ints; nullopt when absent or null.
  absl::StatusOr<std::optional<std::vector<int>>> IntList(const char* key) const {
    const Json* value = Find(key);
    if (value == nullptr) return std::optional<std::vector<int>>();
    std::vector<int> out;
    if (value->is_array()) {
      if (value->size() > 1024) return Error(key, "has more than 1024 entries");
      for (const Json& item : *value) {
        ESTUARY_ASSIGN_OR_RETURN(int id, ToInt(item, key));
        out.push_back(id);
      }
    } else {
      ESTUARY_ASSIGN_OR_RETURN(int id, ToInt(*value, key));
      out.push_back(id);
    }
    return std::optional<std::vector<int>>(std::move(out));
  }

 private:
  absl::StatusOr<int> ToInt(const Json& value, const char* key) const {
    if (!value.is_number()) return Error(key, "is not an integer");
    const double d = value.get<double>();
    if (value.is_number_integer()) {
      // Exact path for integers; the double above only screens the range.
      if (d < std::numeric_limits<int>::min() || d > std::numeric_limits<int>::max()) {
        return Error(key, absl::StrCat("= ", value.dump(), " is out of range"));
      }
      return static_cast<int>(value.get<int64_t>());
    }
    if (!(d >= std::numeric_limits<int>::min() && d <= std::numeric_limits<int>::max()) ||
        d != std::floor(d)) {
      return Error(key, absl::StrCat("= ", value.dump(), " is not an integer in range"));
    }
    return static_cast<int>(d);
  }

  const Json& object_;
  std::string file_;
};

absl::StatusOr<Json> ParseObject(absl::string_view text, absl::string_view file_name) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": not valid UTF-8 JSON"));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": not a JSON object"));
  }
  return json;
}

absl::Status ParseRopeScaling(const Json& json, absl::string_view file_name, RopeScaling& scaling) {
  auto it = json.find("rope_scaling");
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": \"rope_scaling\" is not an object"));
  }
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = it->find(key);
    if (t != it->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return absl::UnimplementedError(absl::StrCat(file_name, ": rope_scaling type '",
                                                 type.substr(0, 64),
                                                 "' is not supported (only "
                                                 "\"llama3\")"));
  }
  const std::string prefix = absl::StrCat(file_name, " rope_scaling");
  Fields fields(*it, prefix);
  if (fields.Find("factor") == nullptr) return fields.Error("factor", "is missing");
  scaling.enabled = true;
  ESTUARY_ASSIGN_OR_RETURN(scaling.factor, fields.FloatOr("factor", 1.0f));
  ESTUARY_ASSIGN_OR_RETURN(scaling.low_freq_factor,
                           fields.FloatOr("low_freq_factor", scaling.low_freq_factor));
  ESTUARY_ASSIGN_OR_RETURN(scaling.high_freq_factor,
                           fields.FloatOr("high_freq_factor", scaling.high_freq_factor));
  ESTUARY_ASSIGN_OR_RETURN(
      scaling.original_max_position_embeddings,
      fields.IntOr("original_max_position_embeddings", scaling.original_max_position_embeddings));
  return absl::OkStatus();
}

// A float as the shortest decimal that reads back to it (1e-05, not 9.99999974737875e-06).
double ShortestDouble(float value) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value);
  *result.ptr = '\0';
  return std::strtod(buf, nullptr);
}

const char* TorchDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return "float32";
  }
}

OrderedJson EosJson(const std::vector<int>& eos_ids) {
  if (eos_ids.size() == 1) return eos_ids[0];
  return OrderedJson(eos_ids);
}

OrderedJson BosJson(int bos_id) { return bos_id < 0 ? OrderedJson(nullptr) : OrderedJson(bos_id); }

}  // namespace

absl::StatusOr<LlamaConfig> ParseHfConfigJson(absl::string_view text, absl::string_view file_name) {
  ESTUARY_ASSIGN_OR_RETURN(Json json, ParseObject(text, file_name));
  bool is_llama = false;
  if (auto it = json.find("architectures"); it != json.end() && it->is_array()) {
    for (const Json& arch : *it) is_llama |= arch.is_string() && arch == "LlamaForCausalLM";
  }
  if (auto it = json.find("model_type"); it != json.end() && it->is_string()) {
    is_llama |= *it == "llama";
  }
  if (!is_llama) {
    return absl::UnimplementedError(
        absl::StrCat(file_name,
                     ": not a Llama model (need architectures [\"LlamaForCausalLM\"] or "
                     "model_type \"llama\")"));
  }

  Fields fields(json, file_name);
  LlamaConfig config;
  ESTUARY_ASSIGN_OR_RETURN(config.dim, fields.RequiredInt("hidden_size"));
  ESTUARY_ASSIGN_OR_RETURN(config.hidden_dim, fields.RequiredInt("intermediate_size"));
  ESTUARY_ASSIGN_OR_RETURN(config.n_layers, fields.RequiredInt("num_hidden_layers"));
  ESTUARY_ASSIGN_OR_RETURN(config.n_heads, fields.RequiredInt("num_attention_heads"));
  ESTUARY_ASSIGN_OR_RETURN(config.n_kv_heads, fields.IntOr("num_key_value_heads", config.n_heads));
  ESTUARY_ASSIGN_OR_RETURN(std::optional<int> head_dim, fields.Int("head_dim"));
  if (head_dim.has_value()) {
    config.head_dim = *head_dim;
  } else if (config.n_heads > 0 && config.dim % config.n_heads == 0) {
    config.head_dim = config.dim / config.n_heads;
  } else {
    return fields.Error("hidden_size", absl::StrCat("= ", config.dim,
                                                    " is not a multiple of num_attention_heads = ",
                                                    config.n_heads));
  }
  ESTUARY_ASSIGN_OR_RETURN(config.vocab_size, fields.RequiredInt("vocab_size"));
  ESTUARY_ASSIGN_OR_RETURN(config.max_seq_len, fields.RequiredInt("max_position_embeddings"));
  ESTUARY_ASSIGN_OR_RETURN(config.rms_eps, fields.FloatOr("rms_norm_eps", 1e-6f));
  ESTUARY_ASSIGN_OR_RETURN(config.rope_theta, fields.FloatOr("rope_theta", 10000.0f));
  ESTUARY_RETURN_IF_ERROR(ParseRopeScaling(json, file_name, config.rope_scaling));
  ESTUARY_ASSIGN_OR_RETURN(config.tied_embeddings, fields.BoolOr("tie_word_embeddings", false));
  config.rope_style = RopeStyle::kHalves;
  // bos: absent -> 1 (the transformers default); explicit null -> none.
  if (auto it = json.find("bos_token_id"); it != json.end() && it->is_null()) {
    config.bos_id = -1;
  } else {
    ESTUARY_ASSIGN_OR_RETURN(config.bos_id, fields.IntOr("bos_token_id", 1));
  }
  ESTUARY_ASSIGN_OR_RETURN(std::optional<std::vector<int>> eos, fields.IntList("eos_token_id"));
  if (eos.has_value()) {
    config.eos_ids = std::move(*eos);
  } else if (auto it = json.find("eos_token_id"); it != json.end()) {
    config.eos_ids.clear();  // explicit null
  }
  return config;
}

absl::Status ApplyHfGenerationConfigJson(absl::string_view text, absl::string_view file_name,
                                         LlamaConfig& config) {
  ESTUARY_ASSIGN_OR_RETURN(Json json, ParseObject(text, file_name));
  Fields fields(json, file_name);
  ESTUARY_ASSIGN_OR_RETURN(std::optional<int> bos, fields.Int("bos_token_id"));
  if (bos.has_value()) config.bos_id = *bos;
  ESTUARY_ASSIGN_OR_RETURN(std::optional<std::vector<int>> eos, fields.IntList("eos_token_id"));
  if (eos.has_value()) config.eos_ids = std::move(*eos);
  return absl::OkStatus();
}

std::string HfConfigJson(const LlamaConfig& config, DType dtype) {
  OrderedJson json = {
      {"architectures", OrderedJson::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_size", config.dim},
      {"intermediate_size", config.hidden_dim},
      {"num_hidden_layers", config.n_layers},
      {"num_attention_heads", config.n_heads},
      {"num_key_value_heads", config.n_kv_heads},
      {"head_dim", config.head_dim},
      {"vocab_size", config.vocab_size},
      {"max_position_embeddings", config.max_seq_len},
      {"rms_norm_eps", ShortestDouble(config.rms_eps)},
      {"rope_theta", ShortestDouble(config.rope_theta)},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", config.tied_embeddings},
      {"bos_token_id", BosJson(config.bos_id)},
      {"eos_token_id", EosJson(config.eos_ids)},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", TorchDType(dtype)},
  };
  if (config.rope_scaling.enabled) {
    json["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", ShortestDouble(config.rope_scaling.factor)},
        {"low_freq_factor", ShortestDouble(config.rope_scaling.low_freq_factor)},
        {"high_freq_factor", ShortestDouble(config.rope_scaling.high_freq_factor)},
        {"original_max_position_embeddings", config.rope_scaling.original_max_position_embeddings},
    };
  }
  return json.dump(2) + "\n";
}

std::string HfGenerationConfigJson(const LlamaConfig& config) {
  OrderedJson json = {
      {"bos_token_id", BosJson(config.bos_id)},
      {"eos_token_id", EosJson(config.eos_ids)},
  };
  return json.dump(2) + "\n";
}

absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::absolute(dir_path, ec);
  if (ec) dir = dir_path;
  dir = dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "dir/" -> "dir"
  const std::string config_path = (dir / "config.json").string();
  ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path, kHfConfigMaxBytes));
  ESTUARY_ASSIGN_OR_RETURN(LlamaConfig config, ParseHfConfigJson(text, config_path));
  const fs::path generation = dir / "generation_config.json";
  if (fs::exists(generation, ec)) {
    ESTUARY_ASSIGN_OR_RETURN(std::string gen_text,
                             ReadFileToString(generation.string(), kHfConfigMaxBytes));
    ESTUARY_RETURN_IF_ERROR(ApplyHfGenerationConfigJson(gen_text, generation.string(), config));
  }
  config.name = dir.filename().string();
  if (absl::Status s = config.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(config_path, ": ", s.message()));
  }
  return config;
}

}  // namespace estuary
