#include "cli/sse_reader.h"

#include "absl/strings/strip.h"

namespace estuary::cli {

void SseReader::Feed(absl::string_view bytes) {
  for (char c : bytes) {
    if (c != '\n') {
      line_.push_back(c);
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    Line(line_);
    line_.clear();
  }
}

void SseReader::Line(absl::string_view line) {
  if (line.empty()) {  // the event ends
    if (has_data_) on_data_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment (keep-alive)
  if (!absl::ConsumePrefix(&line, "data:")) return;
  absl::ConsumePrefix(&line, " ");
  if (has_data_) data_.push_back('\n');
  data_.append(line.data(), line.size());
  has_data_ = true;
}

}  // namespace estuary::cli
