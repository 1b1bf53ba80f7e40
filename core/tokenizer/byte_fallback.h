#pragma once
// SentencePiece byte-fallback pieces "<0xXX>" (used by llama2.c and tokenizer.json BPE).

#include <cstdint>
#include <string>
#include <string_view>

namespace estuary {

// True when `piece` is exactly "<0xXX>" with two hex digits (either case); sets `*byte`.
bool ParseByteFallbackPiece(std::string_view piece, uint8_t* byte);

// "<0xXX>" with upper-case hex digits, as SentencePiece and Hugging Face spell them.
std::string ByteFallbackPiece(uint8_t byte);

}  // namespace estuary
