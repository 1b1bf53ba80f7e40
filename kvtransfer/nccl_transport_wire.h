#pragma once
// The wire format of NcclTransport's protocol frames (nccl_transport.h), carried as messages of
// the control transport: the 8-byte magic "\0ESTNCCL", a type byte, then fixed-width
// little-endian fields and u32-length-prefixed strings. A user message goes as it is unless it
// starts with the magic; then it goes as a kUser frame. Also the rkey of a region descriptor.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace estuary::kvtransfer::nccl {

inline constexpr char kMagicBytes[8] = {'\0', 'E', 'S', 'T', 'N', 'C', 'C', 'L'};
inline constexpr std::string_view kMagic(kMagicBytes, sizeof(kMagicBytes));
inline constexpr uint32_t kProtocolVersion = 1;
// Longest strings a frame may carry (ParseFrame refuses longer ones): a HELLO's group id and
// address, an ABORT / FAIL reason (StatusFrame cuts it to 1 KiB).
inline constexpr size_t kMaxGroupIdBytes = 256;
inline constexpr size_t kMaxAddressBytes = 4096;
inline constexpr size_t kMaxReasonBytes = 4096;

enum class FrameType : uint8_t {
  kUser = 1,   // either way: an escaped user message (the payload follows the type byte)
  kHello = 2,  // sender -> receiver: conn, version, group id, sender address
  kPut = 3,    // sender -> receiver: conn, seq, region key, offset, bytes
  kFlush = 4,  // sender -> receiver: conn, seq of the last put
  kClose = 5,  // sender -> receiver: conn (orderly close after a successful flush)
  kAbort = 6,  // sender -> receiver: conn, code, reason (the sender aborted its communicator)
  kReady = 7,  // receiver -> sender: conn (communicator joined)
  kAck = 8,    // receiver -> sender: conn, seq (every put up to seq has landed)
  kFail = 9,   // receiver -> sender: conn, code, reason (the receiver aborted its communicator)
};

const char* FrameTypeName(FrameType type);

// A parsed frame; the fields its type does not carry stay zero / empty.
struct Frame {
  FrameType type = FrameType::kUser;
  uint64_t conn = 0;
  uint64_t seq = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t version = 0;
  uint32_t code = 0;
  std::string text;     // group id (HELLO), reason (ABORT, FAIL), payload (USER)
  std::string address;  // HELLO: the sender's address
};

// Builds one frame: Writer(FrameType::kAck).U64(conn).U64(seq).Take().
class Writer {
 public:
  explicit Writer(FrameType type);
  Writer& U32(uint32_t v);
  Writer& U64(uint64_t v);
  Writer& Str(std::string_view s);  // u32 length + bytes
  Writer& Raw(std::string_view s);  // bytes to the end (kUser)
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Whether `payload` is a protocol frame (starts with the magic and has a type byte).
bool IsFrame(std::string_view payload);
// Parses a payload for which IsFrame() holds; INVALID_ARGUMENT (naming the type) for an unknown
// type, a truncated frame, trailing bytes, or a string longer than its bound above.
absl::StatusOr<Frame> ParseFrame(std::string_view payload);

// An ABORT or FAIL frame carrying `status` (its message cut to 1 KiB).
std::string StatusFrame(FrameType type, uint64_t conn, const absl::Status& status);
// The status an ABORT / FAIL frame carries, as the other side reports it: the frame's code
// (UNAVAILABLE when it is not a valid code) and "nccl <who> failed the connection: <reason>".
absl::Status FrameStatus(const Frame& frame, absl::string_view who);

// Region rkey: "NCR1" + owner transport id + region key (little-endian u64s).
std::string EncodeRkey(uint64_t owner, uint64_t key);
// INVALID_ARGUMENT when `rkey` is not an NCCL transport rkey.
absl::Status DecodeRkey(std::string_view rkey, uint64_t* owner, uint64_t* key);

}  // namespace estuary::kvtransfer::nccl
