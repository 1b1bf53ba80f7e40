#include "core/loader/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/loader/safetensors.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

absl::Status IoError(const char* what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::Create(
    const std::string& path, const std::vector<SafetensorsTensorSpec>& specs,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsStreamWriter> writer(new SafetensorsStreamWriter());
  writer->path_ = path;
  writer->temp_path_ = path + ".tmp";
  writer->specs_ = specs;

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec& spec : specs) {
    const char* dtype_name = SafetensorsDTypeName(spec.dtype);
    if (dtype_name == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", spec.name, "': dtype ",
                                                     DTypeName(spec.dtype),
                                                     " has no safetensors encoding here"));
    }
    if (spec.name.empty() || spec.name == "__metadata__" || !names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", spec.name, "' is empty, reserved or repeated"));
    }
    ESTUARY_ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(spec.shape));
    const uint64_t end = offset + DTypeBytes(spec.dtype, static_cast<size_t>(numel));
    header[spec.name] = {
        {"dtype", dtype_name}, {"shape", spec.shape}, {"data_offsets", {offset, end}}};
    offset = end;
    writer->ends_.push_back(end);
  }
  writer->data_bytes_ = offset;

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  writer->file_ = std::fopen(writer->temp_path_.c_str(), "wb");
  if (writer->file_ == nullptr) return IoError("create", writer->temp_path_);
  if (std::fwrite(length, 1, 8, writer->file_) != 8 ||
      std::fwrite(text.data(), 1, text.size(), writer->file_) != text.size()) {
    return IoError("write", writer->temp_path_);
  }
  return writer;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) std::remove(temp_path_.c_str());
}

absl::Status SafetensorsStreamWriter::Append(absl::Span<const uint8_t> bytes) {
  if (file_ == nullptr) return absl::FailedPreconditionError("safetensors writer is closed");
  if (bytes.size() > data_bytes_ - written_) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": appending ", bytes.size(),
                                              " bytes past the declared ", data_bytes_));
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return IoError("write", temp_path_);
  }
  written_ += bytes.size();
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::AppendTensor(const Tensor& tensor) {
  if (next_tensor_ >= specs_.size()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": more tensors than declared"));
  }
  if (written_ != (next_tensor_ == 0 ? 0 : ends_[next_tensor_ - 1])) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": AppendTensor does not mix with partial Append calls"));
  }
  const SafetensorsTensorSpec& spec = specs_[next_tensor_];
  if (!tensor.defined() || tensor.dtype() != spec.dtype || tensor.shape() != spec.shape ||
      !tensor.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", spec.name, "' is ",
                                                   tensor.DebugString(), ", declared ",
                                                   DTypeName(spec.dtype)));
  }
  ++next_tensor_;
  return Append(absl::MakeConstSpan(static_cast<const uint8_t*>(tensor.raw()), tensor.nbytes()));
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (file_ == nullptr) return absl::FailedPreconditionError("safetensors writer is closed");
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", written_, " of ", data_bytes_, " data bytes written"));
  }
  const bool write_ok = std::fflush(file_) == 0;
  const bool close_ok = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!write_ok || !close_ok) return IoError("write", temp_path_);
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) return IoError("rename to", path_);
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors)
    specs.push_back({name, tensor.dtype(), tensor.shape()});
  ESTUARY_ASSIGN_OR_RETURN(auto writer, SafetensorsStreamWriter::Create(path, specs, metadata));
  for (const auto& [name, tensor] : tensors) ESTUARY_RETURN_IF_ERROR(writer->AppendTensor(tensor));
  return writer->Finish();
}

}  // namespace estuary
