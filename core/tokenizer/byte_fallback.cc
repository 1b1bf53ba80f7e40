#include "core/tokenizer/byte_fallback.h"

namespace estuary {
namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool ParseByteFallbackPiece(std::string_view piece, uint8_t* byte) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return false;
  const int hi = HexValue(piece[3]);
  const int lo = HexValue(piece[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

std::string ByteFallbackPiece(uint8_t byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string piece = "<0x00>";
  piece[3] = kHex[byte >> 4];
  piece[4] = kHex[byte & 15];
  return piece;
}

}  // namespace estuary
