#include "router/stop_matcher.h"

#include <algorithm>

namespace estuary::router {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_match)
    : stops_(std::move(stops)), include_match_(include_match) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

StopMatcher::Result StopMatcher::Push(std::string_view text) {
  Result result;
  if (stopped_) return result;
  held_.append(text);
  if (stops_.empty()) {
    result.text.swap(held_);
    return result;
  }
  // The earliest match of any stop string. Everything before `held_` was released only once
  // no stop string could start in it, so a match lies wholly inside `held_`.
  // Of the stop strings matching there, the longest.
  size_t first = std::string::npos, matched = 0;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at < first || (at == first && at != std::string::npos && stop.size() > matched)) {
      first = at;
      matched = stop.size();
    }
  }
  if (first != std::string::npos) {
    result.text = held_.substr(0, include_match_ ? first + matched : first);
    result.stopped = true;
    stopped_ = true;
    held_.clear();
    return result;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep_from = held_.size();
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t n = longest; n > 0; --n) {
      if (held_.size() - n >= keep_from) break;  // not longer than what is already kept
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(stop).substr(0, n)) {
        keep_from = held_.size() - n;
        break;
      }
    }
  }
  result.text = held_.substr(0, keep_from);
  held_.erase(0, keep_from);
  return result;
}

std::string StopMatcher::Flush() {
  std::string rest;
  if (!stopped_) rest.swap(held_);
  held_.clear();
  return rest;
}

}  // namespace estuary::router
