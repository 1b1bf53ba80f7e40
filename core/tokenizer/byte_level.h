#pragma once
// GPT-2's reversible byte <-> Unicode mapping used by byte-level BPE (GPT-2, Llama 3): bytes
// 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for the code point of the same value, the other 68
// bytes for U+0100.. in byte order (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). The tables
// are built once; all functions are thread-safe.

#include <string>
#include <string_view>

namespace estuary {

// The UTF-8 string that stands for `byte`.
const std::string& ByteLevelChar(unsigned char byte);

// Maps every byte of `bytes` to its character.
std::string ByteLevelEncode(std::string_view bytes);

// Maps the characters of `token` back to bytes. Returns false (leaving `*out` unspecified) when
// a character is outside the alphabet.
bool ByteLevelDecode(std::string_view token, std::string* out);

}  // namespace estuary
