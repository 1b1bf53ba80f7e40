// libFuzzer target for the NCCL transport's protocol frames (kvtransfer/nccl_transport_wire.h),
// which its dispatcher parses out of every control message from a peer. The first byte picks:
//   0: the rest is a control message: IsFrame, then ParseFrame (NcclTransport's entry point);
//   1: the rest follows the 8-byte magic (so that mutations reach the type and the fields);
//   2: the rest is a region descriptor's rkey: DecodeRkey (NcclEndpoint::ImportRegion).
// A frame that parses must re-encode, with the protocol's own Writer, to exactly the bytes it
// came from (no field dropped, no trailing byte accepted), and its status (ABORT / FAIL) must be
// an error. Seeds: fuzz/corpus/nccl_frame/ (fuzz/make_seeds.py). Run (see fuzz/CMakeLists.txt):
//   ./build-fuzz/fuzz/nccl_frame_fuzzer -max_total_time=60 fuzz/corpus/nccl_frame

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtransfer/nccl_transport_wire.h"

namespace {

namespace nccl = ::estuary::kvtransfer::nccl;

std::string Reencode(const nccl::Frame& f) {
  nccl::Writer w(f.type);
  switch (f.type) {
    case nccl::FrameType::kUser:
      w.Raw(f.text);
      break;
    case nccl::FrameType::kHello:
      w.U64(f.conn).U32(f.version).Str(f.text).Str(f.address);
      break;
    case nccl::FrameType::kPut:
      w.U64(f.conn).U64(f.seq).U64(f.key).U64(f.offset).U64(f.bytes);
      break;
    case nccl::FrameType::kFlush:
    case nccl::FrameType::kAck:
      w.U64(f.conn).U64(f.seq);
      break;
    case nccl::FrameType::kClose:
    case nccl::FrameType::kReady:
      w.U64(f.conn);
      break;
    case nccl::FrameType::kAbort:
    case nccl::FrameType::kFail:
      w.U64(f.conn).U32(f.code).Str(f.text);
      break;
  }
  return w.Take();
}

void CheckMessage(std::string_view payload) {
  if (!nccl::IsFrame(payload)) return;
  auto frame = nccl::ParseFrame(payload);
  if (!frame.ok()) return;
  if (Reencode(*frame) != payload) __builtin_trap();
  if (frame->type == nccl::FrameType::kAbort || frame->type == nccl::FrameType::kFail) {
    if (nccl::FrameStatus(*frame, "peer").ok()) __builtin_trap();
  }
  (void)nccl::FrameTypeName(frame->type);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      CheckMessage(rest);
      break;
    case 1:
      CheckMessage(std::string(nccl::kMagic) + std::string(rest));
      break;
    case 2: {
      uint64_t owner = 0, key = 0;
      if (nccl::DecodeRkey(rest, &owner, &key).ok() && nccl::EncodeRkey(owner, key) != rest) {
        __builtin_trap();
      }
      break;
    }
  }
  return 0;
}
