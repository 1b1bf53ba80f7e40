#pragma once
// StopMatcher: finds a request's stop strings in its generated text as it streams in, across
// chunk boundaries. Text that could be the start of a stop string is held back until it is
// known not to be one, so the client never sees any part of a matched stop string (unless
// asked to include it: vLLM's include_stop_str_in_output); the text before the first match is
// released and the rest is dropped. Held-back text starts where a
// stop string would start, so (stop strings being valid UTF-8) it never splits a code point.
// Not thread-safe; one per request.

#include <string>
#include <string_view>
#include <vector>

namespace estuary::router {

class StopMatcher {
 public:
  // `include_match`: a match's text ends with the stop string itself.
  explicit StopMatcher(std::vector<std::string> stops, bool include_match = false);

  struct Result {
    std::string text;      // what may be sent now
    bool stopped = false;  // a stop string matched; `text` ends right before it (or with it)
  };
  // Adds generated text. After a match, further calls return nothing.
  Result Push(std::string_view text);
  // The end of the stream: releases whatever was held back (nothing after a match).
  std::string Flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_match_ = false;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace estuary::router
