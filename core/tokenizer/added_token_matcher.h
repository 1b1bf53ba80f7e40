#pragma once
// Finds added tokens (tokenizer.json "added_tokens", e.g. <|begin_of_text|>, </s>) in text: at
// each position the longest token that starts there, scanning left to right, as Hugging Face
// does before normalization. A byte trie, so matching costs O(text length x longest token) at
// worst, independent of how many tokens there are. Immutable after construction; thread-safe.

#include <cstdint>
#include <string_view>
#include <vector>

namespace estuary {

class AddedTokenMatcher {
 public:
  struct Segment {
    std::string_view text;  // the text of the segment (a view into the input)
    int32_t id;             // the added token's id, or -1 for ordinary text
  };

  // Adds `content` (non-empty) as token `id`; a later Add of the same content replaces it.
  void Add(std::string_view content, int32_t id);

  // Splits `text` into ordinary text and added tokens, in order; no segment is empty.
  std::vector<Segment> Split(std::string_view text) const;

  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t token_id = -1;  // the token ending here, or -1
    uint8_t byte = 0;
  };
  int32_t Child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_ = std::vector<Node>(1);  // nodes_[0] is the root
};

}  // namespace estuary
