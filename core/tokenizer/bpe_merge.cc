#include "core/tokenizer/bpe_merge.h"

#include <queue>

namespace estuary {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool alive;
};

struct Entry {
  double priority;
  int32_t left;  // index of the left symbol; symbol order never changes, so this is "position"
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

// std::priority_queue pops the "largest": make that the lowest priority, then leftmost.
struct EntryAfter {
  bool operator()(const Entry& a, const Entry& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.left > b.left;
  }
};

}  // namespace

void ApplyMerges(std::vector<int32_t>* ids, MergeLookup lookup) {
  const int32_t n = static_cast<int32_t>(ids->size());
  if (n < 2) return;
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = Symbol{(*ids)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Entry, std::vector<Entry>, EntryAfter> heap;
  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    MergeCandidate candidate;
    if (!lookup(symbols[left].id, symbols[right].id, &candidate)) return;
    heap.push(Entry{candidate.priority, left, symbols[left].id, symbols[right].id,
                    candidate.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    Symbol& left = symbols[top.left];
    // Stale entry: the pair no longer exists as it was when pushed. If the same ids are adjacent
    // again, that pair is a genuine candidate with the same priority, so it is fine to merge.
    if (!left.alive || left.next < 0 || left.id != top.left_id) continue;
    Symbol& right = symbols[left.next];
    if (right.id != top.right_id) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    push_pair(left.prev);
    push_pair(top.left);
  }
  ids->clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace estuary
