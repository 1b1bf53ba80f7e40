// ParseHfTokenizerSpec: tokenizer.json text -> HfTokenizerSpec. Every value is type-checked
// before it is read (nlohmann's get<> and at() throw; get_ptr<> does not), and the parser itself
// runs without exceptions, with a nesting limit enforced while parsing.

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/hf_tokenizer_spec.h"
#include "core/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using Json = nlohmann::json;

absl::Status Error(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

absl::Status Unsupported(absl::string_view where, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

// The DOM builder of json::parse, with a depth limit and the error text kept instead of thrown.
class BoundedDomParser : public nlohmann::detail::json_sax_dom_parser<Json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<Json>;
  explicit BoundedDomParser(Json& root) : Base(root, /*allow_exceptions_=*/false) {}

  bool start_object(std::size_t size) { return Enter() && Base::start_object(size); }
  bool end_object() {
    --depth_;
    return Base::end_object();
  }
  bool start_array(std::size_t size) { return Enter() && Base::start_array(size); }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Exception& ex) {
    error_ = ex.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > kHfMaxJsonDepth) {
      error_ = absl::StrCat("nesting deeper than ", kHfMaxJsonDepth, " levels");
      return false;
    }
    return true;
  }
  int depth_ = 0;
  std::string error_;
};

// Member `key` of `object`, or nullptr when absent (or `object` is not an object).
const Json* Member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const Json* Member(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Member that is absent or null counts as absent.
const Json* OptionalMember(const Json& object, const char* key) {
  const Json* value = Member(object, key);
  return value == nullptr || value->is_null() ? nullptr : value;
}

std::string Path(absl::string_view parent, const char* key) {
  return absl::StrCat(parent, ".", key);
}

std::string Index(absl::string_view parent, size_t i) {
  return absl::StrCat(parent, "[", i, "]");
}

absl::Status ExpectObject(const Json& value, absl::string_view where) {
  if (!value.is_object()) {
    return Error(where, absl::StrCat("expected an object, got ", value.type_name()));
  }
  return absl::OkStatus();
}

absl::Status ExpectArray(const Json& value, absl::string_view where, size_t max_size) {
  if (!value.is_array()) {
    return Error(where, absl::StrCat("expected an array, got ", value.type_name()));
  }
  if (value.size() > max_size) {
    return Error(where,
                 absl::StrCat(value.size(), " elements exceed the limit of ", max_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(const Json& value, absl::string_view where) {
  const auto* text = value.get_ptr<const Json::string_t*>();
  if (text == nullptr) {
    return Error(where, absl::StrCat("expected a string, got ", value.type_name()));
  }
  if (text->size() > kHfMaxTokenBytes) {
    return Error(where, absl::StrCat("string of ", text->size(),
                                     " bytes exceeds the limit of ", kHfMaxTokenBytes));
  }
  return *text;
}

absl::StatusOr<std::string> ReadStringMember(const Json& object, const char* key,
                                             absl::string_view where) {
  const Json* value = Member(object, key);
  if (value == nullptr) return Error(Path(where, key), "missing");
  return ReadString(*value, Path(where, key));
}

absl::StatusOr<int64_t> ReadInt(const Json& value, absl::string_view where, int64_t min,
                                int64_t max) {
  int64_t result = 0;
  if (const auto* u = value.get_ptr<const Json::number_unsigned_t*>(); u != nullptr) {
    if (*u > static_cast<uint64_t>(max)) {
      return Error(where, absl::StrCat(*u, " is outside [", min, ", ", max, "]"));
    }
    result = static_cast<int64_t>(*u);
  } else if (const auto* i = value.get_ptr<const Json::number_integer_t*>(); i != nullptr) {
    result = *i;
  } else {
    return Error(where, absl::StrCat("expected an integer, got ", value.type_name()));
  }
  if (result < min || result > max) {
    return Error(where, absl::StrCat(result, " is outside [", min, ", ", max, "]"));
  }
  return result;
}

// Reads an optional boolean member (absent or null: `fallback`).
absl::StatusOr<bool> ReadBoolMember(const Json& object, const char* key, absl::string_view where,
                                    bool fallback) {
  const Json* value = OptionalMember(object, key);
  if (value == nullptr) return fallback;
  const auto* b = value->get_ptr<const Json::boolean_t*>();
  if (b == nullptr) {
    return Error(Path(where, key), absl::StrCat("expected a boolean, got ", value->type_name()));
  }
  return *b;
}

absl::StatusOr<std::string> ReadType(const Json& object, absl::string_view where) {
  ESTUARY_RETURN_IF_ERROR(ExpectObject(object, where));
  return ReadStringMember(object, "type", where);
}

// A Replace/Split "pattern": {"String": s} or {"Regex": s}.
struct Pattern {
  std::string text;
  bool is_regex = false;
};

absl::StatusOr<Pattern> ReadPattern(const Json& object, absl::string_view where) {
  const std::string path = Path(where, "pattern");
  const Json* pattern = Member(object, "pattern");
  if (pattern == nullptr) return Error(path, "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectObject(*pattern, path));
  Pattern result;
  if (const Json* s = Member(*pattern, "String"); s != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(result.text, ReadString(*s, Path(path, "String")));
  } else if (const Json* r = Member(*pattern, "Regex"); r != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(result.text, ReadString(*r, Path(path, "Regex")));
    result.is_regex = true;
  } else {
    return Error(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  return result;
}

// A single character (Metaspace replacement, Strip content).
absl::StatusOr<std::string> ReadCharMember(const Json& object, const char* key,
                                           absl::string_view where) {
  ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadStringMember(object, key, where));
  size_t length = 0;
  if (text.empty() ||
      utf8::NextSequence(text, 0, &length) != utf8::SequenceStatus::kValid ||
      length != text.size()) {
    return Error(Path(where, key), "expected a single character");
  }
  return text;
}

// Metaspace "prepend_scheme" ("always" | "first" | "never"), or the legacy boolean
// "add_prefix_space".
absl::StatusOr<HfPrependScheme> ReadPrependScheme(const Json& object, absl::string_view where) {
  if (const Json* scheme = OptionalMember(object, "prepend_scheme"); scheme != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(std::string name,
                             ReadString(*scheme, Path(where, "prepend_scheme")));
    if (name == "always") return HfPrependScheme::kAlways;
    if (name == "first") return HfPrependScheme::kFirst;
    if (name == "never") return HfPrependScheme::kNever;
    return Error(Path(where, "prepend_scheme"), absl::StrCat("unknown scheme \"", name, "\""));
  }
  ESTUARY_ASSIGN_OR_RETURN(bool add, ReadBoolMember(object, "add_prefix_space", where, true));
  return add ? HfPrependScheme::kAlways : HfPrependScheme::kNever;
}

absl::Status CheckStepCount(size_t count, absl::string_view where) {
  if (count >= kHfMaxPipelineSteps) {
    return Error(where, absl::StrCat("more than ", kHfMaxPipelineSteps, " steps"));
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const Json& value, const std::string& where,
                             std::vector<HfNormalizerStep>* steps) {
  if (value.is_null()) return absl::OkStatus();
  ESTUARY_ASSIGN_OR_RETURN(std::string type, ReadType(value, where));
  if (type == "Sequence") {
    const std::string path = Path(where, "normalizers");
    const Json* list = Member(value, "normalizers");
    if (list == nullptr) return Error(path, "missing");
    ESTUARY_RETURN_IF_ERROR(ExpectArray(*list, path, kHfMaxPipelineSteps));
    for (size_t i = 0; i < list->size(); ++i) {
      ESTUARY_RETURN_IF_ERROR(ParseNormalizer((*list)[i], Index(path, i), steps));
    }
    return absl::OkStatus();
  }
  ESTUARY_RETURN_IF_ERROR(CheckStepCount(steps->size(), where));
  HfNormalizerStep step;
  if (type == "Prepend") {
    step.kind = HfNormalizerStep::Kind::kPrepend;
    ESTUARY_ASSIGN_OR_RETURN(step.content, ReadStringMember(value, "prepend", where));
  } else if (type == "Replace") {
    step.kind = HfNormalizerStep::Kind::kReplace;
    ESTUARY_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(value, where));
    if (pattern.is_regex) return Unsupported(Path(where, "pattern"), "Regex is not supported");
    if (pattern.text.empty()) return Error(Path(where, "pattern"), "empty pattern");
    step.pattern = std::move(pattern.text);
    ESTUARY_ASSIGN_OR_RETURN(step.content, ReadStringMember(value, "content", where));
  } else {
    return Unsupported(Path(where, "type"), absl::StrCat("normalizer \"", type,
                                                         "\" is not supported"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Json& value, const std::string& where,
                               std::vector<HfPreTokenizerStep>* steps) {
  if (value.is_null()) return absl::OkStatus();
  ESTUARY_ASSIGN_OR_RETURN(std::string type, ReadType(value, where));
  if (type == "Sequence") {
    const std::string path = Path(where, "pretokenizers");
    const Json* list = Member(value, "pretokenizers");
    if (list == nullptr) return Error(path, "missing");
    ESTUARY_RETURN_IF_ERROR(ExpectArray(*list, path, kHfMaxPipelineSteps));
    for (size_t i = 0; i < list->size(); ++i) {
      ESTUARY_RETURN_IF_ERROR(ParsePreTokenizer((*list)[i], Index(path, i), steps));
    }
    return absl::OkStatus();
  }
  ESTUARY_RETURN_IF_ERROR(CheckStepCount(steps->size(), where));
  HfPreTokenizerStep step;
  if (type == "Split") {
    step.kind = HfPreTokenizerStep::Kind::kSplit;
    ESTUARY_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(value, where));
    if (pattern.text.empty()) return Error(Path(where, "pattern"), "empty pattern");
    step.pattern = std::move(pattern.text);
    step.pattern_is_regex = pattern.is_regex;
    ESTUARY_ASSIGN_OR_RETURN(std::string behavior, ReadStringMember(value, "behavior", where));
    if (behavior != "Isolated") {
      return Unsupported(Path(where, "behavior"),
                         absl::StrCat("\"", behavior, "\" is not supported (only Isolated)"));
    }
    ESTUARY_ASSIGN_OR_RETURN(bool invert, ReadBoolMember(value, "invert", where, false));
    if (invert) return Unsupported(Path(where, "invert"), "true is not supported");
  } else if (type == "ByteLevel") {
    step.kind = HfPreTokenizerStep::Kind::kByteLevel;
    ESTUARY_ASSIGN_OR_RETURN(step.add_prefix_space,
                             ReadBoolMember(value, "add_prefix_space", where, true));
    ESTUARY_ASSIGN_OR_RETURN(step.use_regex, ReadBoolMember(value, "use_regex", where, true));
    ESTUARY_ASSIGN_OR_RETURN(bool trim, ReadBoolMember(value, "trim_offsets", where, true));
    (void)trim;  // offsets are not tracked
  } else if (type == "Metaspace") {
    step.kind = HfPreTokenizerStep::Kind::kMetaspace;
    ESTUARY_ASSIGN_OR_RETURN(step.replacement, ReadCharMember(value, "replacement", where));
    ESTUARY_ASSIGN_OR_RETURN(step.prepend_scheme, ReadPrependScheme(value, where));
    ESTUARY_ASSIGN_OR_RETURN(step.split, ReadBoolMember(value, "split", where, true));
  } else {
    return Unsupported(Path(where, "type"), absl::StrCat("pre-tokenizer \"", type,
                                                         "\" is not supported"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Json& value, const std::string& where,
                          std::vector<HfDecoderStep>* steps) {
  if (value.is_null()) return absl::OkStatus();
  ESTUARY_ASSIGN_OR_RETURN(std::string type, ReadType(value, where));
  if (type == "Sequence") {
    const std::string path = Path(where, "decoders");
    const Json* list = Member(value, "decoders");
    if (list == nullptr) return Error(path, "missing");
    ESTUARY_RETURN_IF_ERROR(ExpectArray(*list, path, kHfMaxPipelineSteps));
    for (size_t i = 0; i < list->size(); ++i) {
      ESTUARY_RETURN_IF_ERROR(ParseDecoder((*list)[i], Index(path, i), steps));
    }
    return absl::OkStatus();
  }
  ESTUARY_RETURN_IF_ERROR(CheckStepCount(steps->size(), where));
  HfDecoderStep step;
  if (type == "Replace") {
    step.kind = HfDecoderStep::Kind::kReplace;
    ESTUARY_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(value, where));
    if (pattern.is_regex) return Unsupported(Path(where, "pattern"), "Regex is not supported");
    if (pattern.text.empty()) return Error(Path(where, "pattern"), "empty pattern");
    step.pattern = std::move(pattern.text);
    ESTUARY_ASSIGN_OR_RETURN(step.content, ReadStringMember(value, "content", where));
  } else if (type == "ByteFallback") {
    step.kind = HfDecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = HfDecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = HfDecoderStep::Kind::kStrip;
    ESTUARY_ASSIGN_OR_RETURN(step.content, ReadCharMember(value, "content", where));
    const Json* start = Member(value, "start");
    if (start == nullptr) return Error(Path(where, "start"), "missing");
    ESTUARY_ASSIGN_OR_RETURN(int64_t start_count, ReadInt(*start, Path(where, "start"), 0, 64));
    step.strip_start = static_cast<int32_t>(start_count);
    const Json* stop = Member(value, "stop");
    if (stop == nullptr) return Error(Path(where, "stop"), "missing");
    ESTUARY_ASSIGN_OR_RETURN(int64_t stop_count, ReadInt(*stop, Path(where, "stop"), 0, 64));
    if (stop_count != 0) {
      return Unsupported(Path(where, "stop"), "stripping the end of the text is not supported");
    }
  } else if (type == "ByteLevel") {
    step.kind = HfDecoderStep::Kind::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = HfDecoderStep::Kind::kMetaspace;
    ESTUARY_ASSIGN_OR_RETURN(step.pattern, ReadCharMember(value, "replacement", where));
    ESTUARY_ASSIGN_OR_RETURN(step.prepend_scheme, ReadPrependScheme(value, where));
  } else {
    return Unsupported(Path(where, "type"), absl::StrCat("decoder \"", type,
                                                         "\" is not supported"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& model, HfTokenizerSpec* spec) {
  const std::string where = "model";
  ESTUARY_RETURN_IF_ERROR(ExpectObject(model, where));
  if (const Json* type = OptionalMember(model, "type"); type != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(std::string name, ReadString(*type, "model.type"));
    if (name != "BPE") {
      return Unsupported("model.type", absl::StrCat("model \"", name,
                                                    "\" is not supported (only BPE)"));
    }
  }
  if (const Json* dropout = OptionalMember(model, "dropout"); dropout != nullptr) {
    // Dropout only matters for training; encoding is deterministic here.
    if (!dropout->is_number()) {
      return Error("model.dropout", absl::StrCat("expected a number or null, got ",
                                                 dropout->type_name()));
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* affix = OptionalMember(model, key); affix != nullptr) {
      ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadString(*affix, Path(where, key)));
      if (!text.empty()) return Unsupported(Path(where, key), "is not supported");
    }
  }
  if (const Json* unk = OptionalMember(model, "unk_token"); unk != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(spec->unk_token, ReadString(*unk, "model.unk_token"));
  }
  ESTUARY_ASSIGN_OR_RETURN(spec->fuse_unk, ReadBoolMember(model, "fuse_unk", where, false));
  ESTUARY_ASSIGN_OR_RETURN(spec->byte_fallback,
                           ReadBoolMember(model, "byte_fallback", where, false));
  ESTUARY_ASSIGN_OR_RETURN(spec->ignore_merges,
                           ReadBoolMember(model, "ignore_merges", where, false));

  const Json* vocab = Member(model, "vocab");
  if (vocab == nullptr) return Error("model.vocab", "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectObject(*vocab, "model.vocab"));
  if (vocab->size() > kHfMaxVocabEntries) {
    return Error("model.vocab", absl::StrCat(vocab->size(), " entries exceed the limit of ",
                                             kHfMaxVocabEntries));
  }
  spec->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string& token = it.key();
    if (token.size() > kHfMaxTokenBytes) {
      return Error("model.vocab", absl::StrCat("a token of ", token.size(),
                                               " bytes exceeds the limit of ",
                                               kHfMaxTokenBytes));
    }
    const auto* fast = it.value().get_ptr<const Json::number_unsigned_t*>();
    if (fast != nullptr && *fast < kHfMaxVocabEntries) {
      spec->vocab.emplace_back(token, static_cast<int32_t>(*fast));
      continue;
    }
    ESTUARY_ASSIGN_OR_RETURN(
        int64_t id, ReadInt(it.value(), absl::StrCat("model.vocab[\"", token, "\"]"), 0,
                            static_cast<int64_t>(kHfMaxVocabEntries) - 1));
    spec->vocab.emplace_back(token, static_cast<int32_t>(id));
  }

  const Json* merges = Member(model, "merges");
  if (merges == nullptr) return Error("model.merges", "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectArray(*merges, "model.merges", kHfMaxMerges));
  spec->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& merge = (*merges)[i];
    if (const auto* line = merge.get_ptr<const Json::string_t*>(); line != nullptr) {
      // "a b": exactly one space, as Hugging Face requires.
      const size_t space = line->find(' ');
      if (space == std::string::npos || line->find(' ', space + 1) != std::string::npos) {
        return Error(Index("model.merges", i), "expected \"left right\" with a single space");
      }
      if (line->size() > 2 * kHfMaxTokenBytes) {
        return Error(Index("model.merges", i), "merge exceeds the token size limit");
      }
      spec->merges.emplace_back(line->substr(0, space), line->substr(space + 1));
    } else if (merge.is_array()) {
      if (merge.size() != 2) {
        return Error(Index("model.merges", i),
                     absl::StrCat("expected 2 strings, got ", merge.size(), " elements"));
      }
      ESTUARY_ASSIGN_OR_RETURN(std::string left,
                               ReadString(merge[0], Index(Index("model.merges", i), 0)));
      ESTUARY_ASSIGN_OR_RETURN(std::string right,
                               ReadString(merge[1], Index(Index("model.merges", i), 1)));
      spec->merges.emplace_back(std::move(left), std::move(right));
    } else {
      return Error(Index("model.merges", i),
                   absl::StrCat("expected a string or an array, got ", merge.type_name()));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, HfTokenizerSpec* spec) {
  const Json* list = OptionalMember(root, "added_tokens");
  if (list == nullptr) return absl::OkStatus();
  ESTUARY_RETURN_IF_ERROR(ExpectArray(*list, "added_tokens", kHfMaxAddedTokens));
  size_t total_bytes = 0;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = Index("added_tokens", i);
    const Json& entry = (*list)[i];
    ESTUARY_RETURN_IF_ERROR(ExpectObject(entry, where));
    HfAddedToken token;
    const Json* id = Member(entry, "id");
    if (id == nullptr) return Error(Path(where, "id"), "missing");
    ESTUARY_ASSIGN_OR_RETURN(int64_t id_value,
                             ReadInt(*id, Path(where, "id"), 0,
                                     static_cast<int64_t>(kHfMaxVocabEntries) - 1));
    token.id = static_cast<int32_t>(id_value);
    ESTUARY_ASSIGN_OR_RETURN(token.content, ReadStringMember(entry, "content", where));
    if (token.content.empty()) return Error(Path(where, "content"), "empty");
    total_bytes += token.content.size();
    if (total_bytes > kHfMaxAddedTokenTotalBytes) {
      return Error(where, absl::StrCat("added tokens exceed ", kHfMaxAddedTokenTotalBytes,
                                       " bytes in total"));
    }
    ESTUARY_ASSIGN_OR_RETURN(token.special, ReadBoolMember(entry, "special", where, false));
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

// Finds the TemplateProcessing (possibly inside a Sequence) and the BOS its "single" template
// starts with.
absl::Status ParsePostProcessor(const Json& value, const std::string& where,
                                HfTokenizerSpec* spec) {
  if (value.is_null()) return absl::OkStatus();
  ESTUARY_ASSIGN_OR_RETURN(std::string type, ReadType(value, where));
  if (type == "Sequence") {
    const std::string path = Path(where, "processors");
    const Json* list = Member(value, "processors");
    if (list == nullptr) return Error(path, "missing");
    ESTUARY_RETURN_IF_ERROR(ExpectArray(*list, path, kHfMaxPipelineSteps));
    for (size_t i = 0; i < list->size(); ++i) {
      ESTUARY_RETURN_IF_ERROR(ParsePostProcessor((*list)[i], Index(path, i), spec));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") return absl::OkStatus();  // no effect on encoding here
  if (spec->has_template) return Error(where, "more than one TemplateProcessing");
  spec->has_template = true;
  const std::string single_path = Path(where, "single");
  const Json* single = Member(value, "single");
  if (single == nullptr) return Error(single_path, "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectArray(*single, single_path, kHfMaxPipelineSteps));
  if (single->empty()) return absl::OkStatus();
  const Json& first = (*single)[0];
  ESTUARY_RETURN_IF_ERROR(ExpectObject(first, Index(single_path, 0)));
  const Json* special = Member(first, "SpecialToken");
  if (special == nullptr) return absl::OkStatus();  // starts with the sequence: no BOS
  const std::string special_path = Path(Index(single_path, 0), "SpecialToken");
  ESTUARY_RETURN_IF_ERROR(ExpectObject(*special, special_path));
  ESTUARY_ASSIGN_OR_RETURN(std::string name, ReadStringMember(*special, "id", special_path));

  const std::string tokens_path = Path(where, "special_tokens");
  const Json* tokens = Member(value, "special_tokens");
  if (tokens == nullptr) return Error(tokens_path, "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectObject(*tokens, tokens_path));
  const std::string entry_path = absl::StrCat(tokens_path, "[\"", name, "\"]");
  const Json* entry = Member(*tokens, name);
  if (entry == nullptr) return Error(entry_path, "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectObject(*entry, entry_path));
  const std::string ids_path = Path(entry_path, "ids");
  const Json* ids = Member(*entry, "ids");
  if (ids == nullptr) return Error(ids_path, "missing");
  ESTUARY_RETURN_IF_ERROR(ExpectArray(*ids, ids_path, 16));
  if (ids->size() != 1) return Unsupported(ids_path, "expected exactly one id");
  ESTUARY_ASSIGN_OR_RETURN(int64_t id, ReadInt((*ids)[0], Index(ids_path, 0), 0,
                                               static_cast<int64_t>(kHfMaxVocabEntries) - 1));
  spec->template_bos_id = static_cast<int32_t>(id);
  return absl::OkStatus();
}

absl::StatusOr<HfTokenizerSpec> ParseRoot(const Json& root) {
  if (!root.is_object()) {
    return Error("(root)", absl::StrCat("expected an object, got ", root.type_name()));
  }
  HfTokenizerSpec spec;
  const Json* model = Member(root, "model");
  if (model == nullptr) return Error("model", "missing");
  ESTUARY_RETURN_IF_ERROR(ParseModel(*model, &spec));
  ESTUARY_RETURN_IF_ERROR(ParseAddedTokens(root, &spec));
  if (const Json* n = Member(root, "normalizer"); n != nullptr) {
    ESTUARY_RETURN_IF_ERROR(ParseNormalizer(*n, "normalizer", &spec.normalizers));
  }
  if (const Json* p = Member(root, "pre_tokenizer"); p != nullptr) {
    ESTUARY_RETURN_IF_ERROR(ParsePreTokenizer(*p, "pre_tokenizer", &spec.pre_tokenizers));
  }
  if (const Json* d = Member(root, "decoder"); d != nullptr) {
    ESTUARY_RETURN_IF_ERROR(ParseDecoder(*d, "decoder", &spec.decoders));
  }
  if (const Json* p = Member(root, "post_processor"); p != nullptr) {
    ESTUARY_RETURN_IF_ERROR(ParsePostProcessor(*p, "post_processor", &spec));
  }
  return spec;
}

}  // namespace

absl::StatusOr<HfTokenizerSpec> ParseHfTokenizerSpec(absl::string_view json_text) {
  if (json_text.size() > kHfMaxJsonBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", json_text.size(),
                                                   " bytes exceed the limit of ",
                                                   kHfMaxJsonBytes));
  }
  Json root;
  BoundedDomParser parser(root);
  if (!Json::sax_parse(json_text.begin(), json_text.end(), &parser) ||
      !parser.error().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: not valid JSON: ",
        parser.error().empty() ? std::string("parse failed") : parser.error()));
  }
  return ParseRoot(root);
}

}  // namespace estuary
