#include "core/loader/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_config.h"
#include "core/loader/hf_tensor_names.h"
#include "core/loader/safetensors.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

namespace fs = std::filesystem;

constexpr size_t kIndexMaxBytes = size_t{64} << 20;
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

bool Exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}


// A shard named by the index must be a plain file name in the model folder.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos && name != ".";
}

struct Shard {
  std::string file_name;
  std::shared_ptr<const MappedFile> file;
  SafetensorsHeader header;
  std::unordered_map<std::string, size_t> by_name;  // tensor name -> index in header.tensors
};

absl::StatusOr<Shard> OpenShard(const fs::path& dir, const std::string& file_name) {
  Shard shard;
  shard.file_name = file_name;
  ESTUARY_ASSIGN_OR_RETURN(shard.file, MappedFile::Open((dir / file_name).string()));
  ESTUARY_ASSIGN_OR_RETURN(
      shard.header,
      ParseSafetensorsHeader(absl::MakeConstSpan(shard.file->data(), shard.file->size()),
                             shard.file->path()));
  for (size_t i = 0; i < shard.header.tensors.size(); ++i) {
    shard.by_name.emplace(shard.header.tensors[i].name, i);
  }
  return shard;
}

// tensor name -> shard file name, from the index.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const fs::path& index_path) {
  const std::string path = index_path.string();
  ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kIndexMaxBytes));
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto map_it = json.find("weight_map");
  if (map_it == json.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing object \"weight_map\""));
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": shard ", absl::CHexEscape(shard.dump().substr(0, 200)),
                       " for tensor '", absl::CHexEscape(tensor.substr(0, 200)),
                       "' is not a plain file name in the model folder"));
    }
    out[tensor] = shard.get<std::string>();
  }
  return out;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<LlamaCheckpoint> LoadHfCheckpoint(const std::string& dir_name,
                                                 const ProgressCallback& progress) {
  const fs::path dir(dir_name);
  LlamaCheckpoint checkpoint;
  ESTUARY_ASSIGN_OR_RETURN(checkpoint.config, ReadHfConfig(dir));
  const LlamaConfig& config = checkpoint.config;

  // Which shard holds which tensor.
  std::map<std::string, std::string> weight_map;  // empty: everything is in model.safetensors
  const bool sharded = Exists(dir / kIndexFile);
  if (sharded) {
    ESTUARY_ASSIGN_OR_RETURN(weight_map, ReadWeightMap(dir / kIndexFile));
  } else if (!Exists(dir / kSingleFile)) {
    return absl::NotFoundError(absl::StrCat(dir_name, ": no ", kSingleFile, " or ", kIndexFile));
  }
  std::map<std::string, Shard> shards;
  auto shard_for = [&](const std::string& file_name) -> absl::StatusOr<Shard*> {
    auto it = shards.find(file_name);
    if (it == shards.end()) {
      ESTUARY_ASSIGN_OR_RETURN(Shard shard, OpenShard(dir, file_name));
      it = shards.emplace(file_name, std::move(shard)).first;
    }
    return &it->second;
  };

  // Pass 1: find every tensor and check its shape before loading anything.
  struct Located {
    HfTensorInfo info;
    Shard* shard;
    const SafetensorsEntry* entry;
  };
  std::vector<Located> located;
  int64_t bytes_total = 0;
  for (HfTensorInfo& info : HfLlamaTensors(config)) {
    std::string file_name = kSingleFile;
    if (sharded) {
      auto it = weight_map.find(info.name);
      if (it == weight_map.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            (dir / kIndexFile).string(), ": checkpoint has no tensor '", info.name, "'"));
      }
      file_name = it->second;
    }
    ESTUARY_ASSIGN_OR_RETURN(Shard * shard, shard_for(file_name));
    auto it = shard->by_name.find(info.name);
    if (it == shard->by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(shard->file->path(), ": checkpoint has no tensor '", info.name, "'"));
    }
    const SafetensorsEntry& entry = shard->header.tensors[it->second];
    if (entry.shape != info.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          shard->file->path(), ": tensor '", info.name, "' has shape ", ShapeString(entry.shape),
          ", expected ", ShapeString(info.shape), " from config.json"));
    }
    bytes_total += static_cast<int64_t>(entry.end - entry.begin);
    located.push_back({std::move(info), shard, &entry});
  }

  // Pass 2: map the tensors.
  LoadProgress report{0, bytes_total, "weights"};
  if (progress) progress(report);
  checkpoint.weights.layers.resize(static_cast<size_t>(config.n_layers));
  for (const Located& l : located) {
    ESTUARY_ASSIGN_OR_RETURN(WeightSlot(checkpoint.weights, l.info),
                             SafetensorsTensor(l.shard->file, l.shard->header, *l.entry));
    report.bytes_done += static_cast<int64_t>(l.entry->end - l.entry->begin);
    report.stage = l.shard->file_name;
    if (progress) progress(report);
  }
  if (config.tied_embeddings) checkpoint.weights.lm_head = checkpoint.weights.embedding;
  return checkpoint;
}

}  // namespace estuary
