#pragma once
// Test support for the decode engine's tests: a TokenSink that keeps every request's tokens and
// final event.

#include <map>
#include <string>
#include <vector>

#include "decode/decode_request.h"

namespace estuary {

struct TokenCollector {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, TokenEvent> final_events;
  TokenSink Sink() {
    return [this](const TokenEvent& e) {
      if (e.token_id >= 0) tokens[e.request_id].push_back(e.token_id);
      if (e.finished) final_events[e.request_id] = e;
    };
  }
};

}  // namespace estuary
