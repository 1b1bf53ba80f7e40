#pragma once
// SseReader: splits a Server-Sent Events byte stream (as OpenAI and vLLM stream completions:
// `data: {json}\n\n` per event, `data: [DONE]\n\n` at the end, `: comment` lines as
// keep-alives) into the data of each event, however the bytes arrive in pieces. Lines may end
// in \n or \r\n; an event's several `data:` lines are joined with \n (the SSE rules); other
// fields (event:, id:, retry:) are ignored. Used by bench-serve's HTTP client.

#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace estuary::cli {

class SseReader {
 public:
  // Called with each event's data (without the `data: ` prefix), in order.
  using DataFn = std::function<void(const std::string& data)>;
  explicit SseReader(DataFn on_data) : on_data_(std::move(on_data)) {}

  // Feeds the next bytes; whole events are handed to the callback at once.
  void Feed(absl::string_view bytes);
  // Bytes held for an event or line not yet ended (a stream must end with nothing here).
  size_t pending_bytes() const { return line_.size() + data_.size(); }

 private:
  void Line(absl::string_view line);

  DataFn on_data_;
  std::string line_;  // the current line, not yet ended
  std::string data_;  // the current event's data lines
  bool has_data_ = false;
};

}  // namespace estuary::cli
