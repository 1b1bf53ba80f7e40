#include "core/tokenizer/added_token_matcher.h"

namespace estuary {

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  for (int32_t child = nodes_[node].first_child; child >= 0; child = nodes_[child].next_sibling) {
    if (nodes_[child].byte == byte) return child;
  }
  return -1;
}

void AddedTokenMatcher::Add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  int32_t node = 0;
  for (const char c : content) {
    const uint8_t byte = static_cast<uint8_t>(c);
    int32_t child = Child(node, byte);
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      Node added;
      added.byte = byte;
      added.next_sibling = nodes_[node].first_child;
      nodes_.push_back(added);
      nodes_[node].first_child = child;
    }
    node = child;
  }
  nodes_[node].token_id = id;
}

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<Segment> segments;
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest token starting at `pos`.
    int32_t node = 0;
    int32_t best_id = -1;
    size_t best_length = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token_id >= 0) {
        best_id = nodes_[node].token_id;
        best_length = i + 1 - pos;
      }
    }
    if (best_id < 0) {
      ++pos;
      continue;
    }
    if (pos > plain_begin) segments.push_back({text.substr(plain_begin, pos - plain_begin), -1});
    segments.push_back({text.substr(pos, best_length), best_id});
    pos += best_length;
    plain_begin = pos;
  }
  if (plain_begin < text.size()) segments.push_back({text.substr(plain_begin), -1});
  return segments;
}

}  // namespace estuary
