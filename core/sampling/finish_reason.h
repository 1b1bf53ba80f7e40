#pragma once
// FinishReason: why a sequence ended. Lives beside sampling, below the model, so that both the
// engines and the processes that run no model (the router, the wire conversions in rpc/) can
// use it.

namespace estuary {

enum class FinishReason {
  kEos,        // an EOS id of the model
  kStopToken,  // one of the request's stop token ids
  kLength,     // max_tokens
  kContext,    // prompt plus completion reached the context length
  kCancelled,  // aborted by the client
  kError,      // ended by an error (see the accompanying status)
};
const char* FinishReasonName(FinishReason reason);

}  // namespace estuary
