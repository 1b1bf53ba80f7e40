#include "core/loader/safetensors.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/loader/mapped_buffer.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using Json = nlohmann::json;

struct DTypeInfo {
  const char* name;
  uint64_t bytes;
  std::optional<DType> dtype;  // set for the dtypes Estuary loads
};

constexpr DTypeInfo kDTypes[] = {
    {"F64", 8, std::nullopt},  {"F32", 4, DType::kF32},      {"F16", 2, DType::kF16},
    {"BF16", 2, DType::kBF16}, {"I64", 8, std::nullopt},     {"I32", 4, std::nullopt},
    {"I16", 2, std::nullopt},  {"I8", 1, std::nullopt},      {"U64", 8, std::nullopt},
    {"U32", 4, std::nullopt},  {"U16", 2, std::nullopt},     {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeInfo* FindDType(const std::string& name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

// Names from the file go into messages: bounded and escaped.
std::string Quoted(absl::string_view text) {
  constexpr size_t kMax = 120;
  std::string out = absl::StrCat("'", absl::CHexEscape(text.substr(0, kMax)), "'");
  if (text.size() > kMax) absl::StrAppend(&out, "...");
  return out;
}

// Nesting depth of JSON text, not counting brackets inside strings. Stops counting past `limit`.
int JsonDepth(absl::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// A non-negative JSON integer (stored by nlohmann as unsigned), or nullopt.
std::optional<uint64_t> AsUnsigned(const Json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<uint64_t>();
}

class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view file_name) : file_(file_name) {}

  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", what));
  }
  absl::Status InvalidTensor(const std::string& name, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": tensor ", Quoted(name), ": ", what));
  }

  absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value,
                                              uint64_t data_size) const {
    SafetensorsEntry entry;
    entry.name = name;
    if (!value.is_object()) return InvalidTensor(name, "entry is not a JSON object");

    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      return InvalidTensor(name, "missing string field \"dtype\"");
    }
    entry.dtype_name = dtype_it->get<std::string>();
    const DTypeInfo* info = FindDType(entry.dtype_name);
    if (info == nullptr) {
      return InvalidTensor(name, absl::StrCat("unknown dtype ", Quoted(entry.dtype_name)));
    }
    entry.loadable = info->dtype.has_value();
    if (entry.loadable) entry.dtype = *info->dtype;

    auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) {
      return InvalidTensor(name, "missing array field \"shape\"");
    }
    if (shape_it->size() > static_cast<size_t>(kSafetensorsMaxRank)) {
      return InvalidTensor(name, absl::StrCat("shape has rank ", shape_it->size(), ", more than ",
                                              kSafetensorsMaxRank));
    }
    for (const Json& d : *shape_it) {
      std::optional<uint64_t> dim = AsUnsigned(d);
      if (!dim.has_value()) {
        return InvalidTensor(name,
                             absl::StrCat("shape ", shape_it->dump(),
                                          " has an entry that is not a non-negative integer"));
      }
      if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidTensor(name, absl::StrCat("shape dimension ", *dim, " overflows"));
      }
      entry.shape.push_back(static_cast<int64_t>(*dim));
    }
    // 2^56 elements of at most 8 bytes cannot overflow a uint64 byte count.
    absl::StatusOr<int64_t> numel = CheckedNumel(entry.shape, int64_t{1} << 56);
    if (!numel.ok()) {
      return InvalidTensor(
          name, absl::StrCat("shape [", absl::StrJoin(entry.shape, ", "), "] overflows"));
    }

    auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return InvalidTensor(name, "missing field \"data_offsets\" ([begin, end])");
    }
    std::optional<uint64_t> begin = AsUnsigned((*offsets_it)[0]);
    std::optional<uint64_t> end = AsUnsigned((*offsets_it)[1]);
    if (!begin.has_value() || !end.has_value()) {
      return InvalidTensor(name, absl::StrCat("data_offsets ", offsets_it->dump(),
                                              " are not non-negative integers"));
    }
    entry.begin = *begin;
    entry.end = *end;
    const std::string offsets = absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
    if (entry.begin > entry.end) {
      return InvalidTensor(name, absl::StrCat(offsets, " end before they begin"));
    }
    if (entry.end > data_size) {
      return absl::DataLossError(absl::StrCat(file_, ": tensor ", Quoted(name), ": ", offsets,
                                              " run past the end of the data (", data_size,
                                              " bytes; is the file truncated?)"));
    }
    const uint64_t needed = static_cast<uint64_t>(*numel) * info->bytes;
    if (entry.end - entry.begin != needed) {
      return InvalidTensor(
          name, absl::StrCat(offsets, " but shape [", absl::StrJoin(entry.shape, ", "), "] of ",
                             entry.dtype_name, " needs ", needed, " bytes"));
    }
    return entry;
  }

  absl::Status ParseMetadata(const Json& value, std::map<std::string, std::string>& out) const {
    if (!value.is_object()) return Invalid("__metadata__ is not a JSON object");
    for (const auto& [key, item] : value.items()) {
      if (!item.is_string()) {
        return Invalid(absl::StrCat("__metadata__ value for ", Quoted(key), " is not a string"));
      }
      out[key] = item.get<std::string>();
    }
    return absl::OkStatus();
  }

  // Tensors sorted by offset must tile [0, data_size) exactly.
  absl::Status CheckLayout(const std::vector<SafetensorsEntry>& tensors, uint64_t data_size) const {
    uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& t : tensors) {
      if (t.begin < covered) {
        return InvalidTensor(t.name, absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                                                  "] overlap tensor ", Quoted(previous->name), " [",
                                                  previous->begin, ", ", previous->end, "]"));
      }
      if (t.begin > covered) {
        return InvalidTensor(t.name, absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                                                  "] leave a gap after byte ", covered,
                                                  " (tensors must be contiguous)"));
      }
      covered = t.end;
      previous = &t;
    }
    if (covered != data_size) {
      return Invalid(
          absl::StrCat("the data region is ", data_size, " bytes but the tensors cover ", covered));
    }
    return absl::OkStatus();
  }

 private:
  std::string file_;
};

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kInt4:
      break;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file_bytes,
                                                         absl::string_view file_name) {
  HeaderParser parser(file_name);
  const uint64_t file_size = file_bytes.size();
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(file_name, ": file is ", file_size,
                                            " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | file_bytes[i];  // little-endian
  if (header_size > kSafetensorsMaxHeaderBytes) {
    return parser.Invalid(absl::StrCat("header length ", header_size, " exceeds the limit of ",
                                       kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (header_size > file_size - 8) {
    return absl::DataLossError(absl::StrCat(file_name, ": header length ", header_size,
                                            " runs past the end of the ", file_size, "-byte file"));
  }
  const absl::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8,
                               static_cast<size_t>(header_size));
  if (text.empty() || text[0] != '{') {
    return parser.Invalid("header does not start with '{'");
  }
  if (JsonDepth(text, kSafetensorsMaxHeaderDepth) > kSafetensorsMaxHeaderDepth) {
    return parser.Invalid(
        absl::StrCat("header JSON nests deeper than ", kSafetensorsMaxHeaderDepth, " levels"));
  }
  // Top-level keys are recorded while parsing: nlohmann keeps only the last of duplicates.
  std::set<std::string> keys;
  bool duplicate = false;
  std::string duplicate_name;
  const Json root = Json::parse(
      text.begin(), text.end(),
      [&](int depth, Json::parse_event_t event, Json& parsed) {
        if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string() &&
            !keys.insert(parsed.get<std::string>()).second && !duplicate) {
          duplicate = true;
          duplicate_name = parsed.get<std::string>();
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (root.is_discarded()) return parser.Invalid("header is not valid UTF-8 JSON");
  if (!root.is_object()) return parser.Invalid("header is not a JSON object");
  if (duplicate) return parser.Invalid(absl::StrCat("duplicate key ", Quoted(duplicate_name)));

  SafetensorsHeader header;
  header.data_start = 8 + header_size;
  const uint64_t data_size = file_size - header.data_start;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      ESTUARY_RETURN_IF_ERROR(parser.ParseMetadata(value, header.metadata));
      continue;
    }
    ESTUARY_ASSIGN_OR_RETURN(SafetensorsEntry entry, parser.ParseEntry(key, value, data_size));
    header.tensors.push_back(std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  ESTUARY_RETURN_IF_ERROR(parser.CheckLayout(header.tensors, data_size));
  return header;
}

absl::StatusOr<Tensor> SafetensorsTensor(std::shared_ptr<const MappedFile> file,
                                         const SafetensorsHeader& header,
                                         const SafetensorsEntry& entry) {
  if (!entry.loadable) {
    return absl::UnimplementedError(absl::StrCat(file->path(), ": tensor ", Quoted(entry.name),
                                                 " has dtype ", entry.dtype_name,
                                                 "; Estuary loads F32, BF16 and F16"));
  }
  // The header may come from another parse: check the range against this file again.
  const uint64_t size = file->size();
  const absl::StatusOr<int64_t> numel = CheckedNumel(entry.shape);
  if (!numel.ok() || entry.begin > entry.end || header.data_start > size ||
      entry.end > size - header.data_start ||
      entry.end - entry.begin != DTypeBytes(entry.dtype, static_cast<size_t>(*numel))) {
    return absl::DataLossError(
        absl::StrCat(file->path(), ": tensor ", Quoted(entry.name), " does not fit the file"));
  }
  const size_t offset = static_cast<size_t>(header.data_start + entry.begin);
  const size_t bytes = static_cast<size_t>(entry.end - entry.begin);
  const size_t element = DTypeBytes(entry.dtype, 1);
  if (bytes == 0) return Tensor::Zeros(entry.dtype, entry.shape);
  if (reinterpret_cast<uintptr_t>(file->data() + offset) % element == 0) {
    return Tensor::View(MappedRangeBuffer(std::move(file), offset, bytes), 0, entry.dtype,
                        entry.shape);
  }
  // Misaligned for its element type (legal in safetensors): copy into aligned memory.
  absl::StatusOr<Tensor> copy = Tensor::HostCopyOf(file->data() + offset, entry.dtype, entry.shape);
  if (!copy.ok()) {
    return absl::Status(copy.status().code(),
                        absl::StrCat(Quoted(entry.name), ": ", copy.status().message()));
  }
  return copy;
}

}  // namespace estuary
