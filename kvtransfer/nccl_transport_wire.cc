#include "kvtransfer/nccl_transport_wire.h"

#include "absl/strings/str_cat.h"

namespace estuary::kvtransfer::nccl {
namespace {

constexpr std::string_view kRkeyMagic = "NCR1";
constexpr size_t kRkeyBytes = 4 + 8 + 8;  // magic, owner transport id, region key

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      *v |= static_cast<uint32_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(4);
    return true;
  }
  bool U64(uint64_t* v) {
    if (in_.size() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) {
      *v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(8);
    return true;
  }
  bool Str(std::string* s, size_t max_bytes) {
    uint32_t n = 0;
    if (!U32(&n) || in_.size() < n || n > max_bytes) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  std::string_view rest() const { return in_; }
  bool empty() const { return in_.empty(); }

 private:
  std::string_view in_;
};

}  // namespace

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kUser:
      return "USER";
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kPut:
      return "PUT";
    case FrameType::kFlush:
      return "FLUSH";
    case FrameType::kClose:
      return "CLOSE";
    case FrameType::kAbort:
      return "ABORT";
    case FrameType::kReady:
      return "READY";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kFail:
      return "FAIL";
  }
  return "?";
}

Writer::Writer(FrameType type) {
  out_.append(kMagic);
  out_.push_back(static_cast<char>(type));
}

Writer& Writer::U32(uint32_t v) {
  PutU32(out_, v);
  return *this;
}

Writer& Writer::U64(uint64_t v) {
  PutU64(out_, v);
  return *this;
}

Writer& Writer::Str(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  out_.append(s);
  return *this;
}

Writer& Writer::Raw(std::string_view s) {
  out_.append(s);
  return *this;
}

bool IsFrame(std::string_view payload) {
  return payload.size() > kMagic.size() && payload.substr(0, kMagic.size()) == kMagic;
}

absl::StatusOr<Frame> ParseFrame(std::string_view payload) {
  if (!IsFrame(payload)) return absl::InvalidArgumentError("not an NCCL transport frame");
  Frame f;
  const uint8_t type = static_cast<uint8_t>(payload[kMagic.size()]);
  if (type < static_cast<uint8_t>(FrameType::kUser) ||
      type > static_cast<uint8_t>(FrameType::kFail)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown NCCL transport frame type ", type));
  }
  f.type = static_cast<FrameType>(type);
  Reader r(payload.substr(kMagic.size() + 1));
  bool ok = true;
  switch (f.type) {
    case FrameType::kUser:
      f.text = std::string(r.rest());
      return f;
    case FrameType::kHello:
      ok = r.U64(&f.conn) && r.U32(&f.version) && r.Str(&f.text, kMaxGroupIdBytes) &&
           r.Str(&f.address, kMaxAddressBytes);
      break;
    case FrameType::kPut:
      ok = r.U64(&f.conn) && r.U64(&f.seq) && r.U64(&f.key) && r.U64(&f.offset) && r.U64(&f.bytes);
      break;
    case FrameType::kFlush:
    case FrameType::kAck:
      ok = r.U64(&f.conn) && r.U64(&f.seq);
      break;
    case FrameType::kClose:
    case FrameType::kReady:
      ok = r.U64(&f.conn);
      break;
    case FrameType::kAbort:
    case FrameType::kFail:
      ok = r.U64(&f.conn) && r.U32(&f.code) && r.Str(&f.text, kMaxReasonBytes);
      break;
  }
  if (!ok || !r.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed NCCL transport ",
                                                   FrameTypeName(f.type), " frame of ",
                                                   payload.size(), " bytes"));
  }
  return f;
}

std::string StatusFrame(FrameType type, uint64_t conn, const absl::Status& status) {
  const absl::string_view message = status.message().substr(0, 1024);
  return Writer(type)
      .U64(conn)
      .U32(static_cast<uint32_t>(status.code()))
      .Str(std::string_view(message.data(), message.size()))
      .Take();
}

absl::Status FrameStatus(const Frame& frame, absl::string_view who) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (frame.code > 0 && frame.code <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<absl::StatusCode>(frame.code);
  }
  return absl::Status(code, absl::StrCat("nccl ", who, " failed the connection: ", frame.text));
}

std::string EncodeRkey(uint64_t owner, uint64_t key) {
  std::string rkey(kRkeyMagic);
  PutU64(rkey, owner);
  PutU64(rkey, key);
  return rkey;
}

absl::Status DecodeRkey(std::string_view rkey, uint64_t* owner, uint64_t* key) {
  if (rkey.size() != kRkeyBytes || rkey.substr(0, kRkeyMagic.size()) != kRkeyMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an NCCL transport region descriptor (rkey of ", rkey.size(), " bytes)"));
  }
  Reader r(rkey.substr(kRkeyMagic.size()));
  r.U64(owner);
  r.U64(key);
  return absl::OkStatus();
}

}  // namespace estuary::kvtransfer::nccl
