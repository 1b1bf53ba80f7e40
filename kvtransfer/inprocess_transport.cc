#include "kvtransfer/inprocess_transport.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/string_view.h"

namespace estuary::kvtransfer {
namespace {

// Process-wide registry: transports by id and registered regions by key. One lock for all, held
// across each memcpy (see the header).
struct Registry {
  absl::Mutex mu;
  uint64_t next_transport = 1;
  uint64_t next_region = 1;
  absl::flat_hash_map<uint64_t, std::weak_ptr<InProcessTransport::State>> transports;
  struct Region {
    uint64_t owner = 0;
    char* data = nullptr;
    size_t bytes = 0;
  };
  absl::flat_hash_map<uint64_t, Region> regions;
};

Registry& GlobalRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

std::string RkeyBytes(uint64_t key) { return std::string(reinterpret_cast<const char*>(&key), 8); }

}  // namespace

struct InProcessTransport::State {
  uint64_t number = 0;
  std::string address;
  MessageInbox inbox;
};

namespace {

class InProcessRegion : public RegisteredRegion {
 public:
  InProcessRegion(uint64_t key, void* data, size_t bytes, void* owned)
      : key_(key), data_(data), bytes_(bytes), owned_(owned) {}
  ~InProcessRegion() override {
    Registry& r = GlobalRegistry();
    {
      absl::MutexLock lock(&r.mu);
      r.regions.erase(key_);
    }
    std::free(owned_);
  }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  RegionDescriptor Describe() const override {
    return RegionDescriptor{reinterpret_cast<uint64_t>(data_), bytes_, RkeyBytes(key_)};
  }

 private:
  uint64_t key_;
  void* data_;
  size_t bytes_;
  void* owned_;
};

class InProcessRemoteRegion : public RemoteRegion {
 public:
  InProcessRemoteRegion(uint64_t key, uint64_t base, uint64_t bytes)
      : key_(key), base_(base), bytes_(bytes) {}
  uint64_t base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  uint64_t key() const { return key_; }

 private:
  uint64_t key_, base_, bytes_;
};

class InProcessEndpoint : public Endpoint {
 public:
  InProcessEndpoint(uint64_t self_id, uint64_t peer_number, uint64_t peer_id)
      : self_id_(self_id), peer_number_(peer_number), peer_id_(peer_id) {}

  uint64_t peer_id() const override { return peer_id_; }

  absl::StatusOr<const RemoteRegion*> ImportRegion(const RegionDescriptor& region) override {
    if (region.rkey.size() != 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("inproc rkey must be 8 bytes, got ", region.rkey.size()));
    }
    uint64_t key;
    std::memcpy(&key, region.rkey.data(), 8);
    imported_.push_back(std::make_unique<InProcessRemoteRegion>(key, region.base, region.bytes));
    return imported_.back().get();
  }

  absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst, uint64_t dst_offset,
                   absl::Time deadline) override {
    const auto& remote = static_cast<const InProcessRemoteRegion&>(dst);
    if (dst_offset > remote.bytes() || bytes > remote.bytes() - dst_offset) {
      return absl::InvalidArgumentError(absl::StrCat("put of ", bytes, " bytes at offset ",
                                                     dst_offset, " overruns a remote region of ",
                                                     remote.bytes(), " bytes"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("inproc put: its deadline passed before it was posted");
    }
    Registry& r = GlobalRegistry();
    absl::MutexLock lock(&r.mu);
    if (PeerLocked() == nullptr) return Dead();
    auto it = r.regions.find(remote.key());
    if (it == r.regions.end() || it->second.owner != peer_number_) {
      return absl::UnavailableError("inproc put: the remote region is no longer registered");
    }
    if (dst_offset + bytes > it->second.bytes) {
      return absl::InvalidArgumentError("inproc put overruns the registered region");
    }
    std::memcpy(it->second.data + dst_offset, local, bytes);
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Time deadline) override { return Health(); }

  absl::Status SendMessage(std::string_view payload, absl::Time deadline) override {
    if (payload.size() > Transport::kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("message of ", payload.size(), " bytes exceeds the limit"));
    }
    std::shared_ptr<InProcessTransport::State> peer = Peer();
    if (peer == nullptr) return Dead();
    peer->inbox.Push(Message{self_id_, std::string(payload)});
    return absl::OkStatus();
  }

  absl::Status Health() const override { return Peer() == nullptr ? Dead() : absl::OkStatus(); }

 private:
  std::shared_ptr<InProcessTransport::State> Peer() const {
    Registry& r = GlobalRegistry();
    absl::MutexLock lock(&r.mu);
    return PeerLocked();
  }
  std::shared_ptr<InProcessTransport::State> PeerLocked() const {
    auto it = GlobalRegistry().transports.find(peer_number_);
    return it == GlobalRegistry().transports.end() ? nullptr : it->second.lock();
  }
  static absl::Status Dead() {
    return absl::UnavailableError("inproc peer transport is gone");
  }

  const uint64_t self_id_;
  const uint64_t peer_number_;
  const uint64_t peer_id_;
  std::vector<std::unique_ptr<InProcessRemoteRegion>> imported_;
};

}  // namespace

std::unique_ptr<InProcessTransport> InProcessTransport::Create() {
  auto state = std::make_shared<State>();
  Registry& r = GlobalRegistry();
  absl::MutexLock lock(&r.mu);
  state->number = r.next_transport++;
  state->address = absl::StrCat("inproc:", state->number);
  r.transports[state->number] = state;
  return std::unique_ptr<InProcessTransport>(new InProcessTransport(std::move(state)));
}

InProcessTransport::InProcessTransport(std::shared_ptr<State> state)
    : state_(std::move(state)), address_(state_->address) {}

InProcessTransport::~InProcessTransport() {
  Registry& r = GlobalRegistry();
  absl::MutexLock lock(&r.mu);
  r.transports.erase(state_->number);
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> InProcessTransport::RegisterRegion(void* data,
                                                                                     size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("RegisterRegion needs a non-empty region");
  }
  Registry& r = GlobalRegistry();
  absl::MutexLock lock(&r.mu);
  const uint64_t key = r.next_region++;
  r.regions[key] = Registry::Region{state_->number, static_cast<char*>(data), bytes};
  return std::unique_ptr<RegisteredRegion>(new InProcessRegion(key, data, bytes, nullptr));
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> InProcessTransport::AllocateRegion(
    size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateRegion needs bytes > 0");
  void* p = std::calloc(1, bytes);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("calloc ", bytes));
  Registry& r = GlobalRegistry();
  absl::MutexLock lock(&r.mu);
  const uint64_t key = r.next_region++;
  r.regions[key] = Registry::Region{state_->number, static_cast<char*>(p), bytes};
  return std::unique_ptr<RegisteredRegion>(new InProcessRegion(key, p, bytes, p));
}

absl::StatusOr<std::unique_ptr<Endpoint>> InProcessTransport::Connect(
    std::string_view peer_address, absl::Time deadline) {
  uint64_t number = 0;
  if (peer_address.substr(0, 7) != "inproc:" ||
      !absl::SimpleAtoi(absl::string_view(peer_address.data() + 7, peer_address.size() - 7),
                        &number)) {
    return absl::InvalidArgumentError("not an inproc transport address");
  }
  Registry& r = GlobalRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.transports.find(number);
  if (it == r.transports.end() || it->second.expired()) {
    return absl::UnavailableError(absl::StrCat("no inproc transport ", number));
  }
  return std::unique_ptr<Endpoint>(
      new InProcessEndpoint(id(), number, Transport::PeerId(peer_address)));
}

absl::StatusOr<Message> InProcessTransport::PollMessage(absl::Time deadline) {
  return state_->inbox.Pop(deadline);
}

absl::StatusOr<Message> InProcessTransport::ReceiveFrom(const Endpoint& peer,
                                                        absl::Time deadline) {
  return state_->inbox.PopFrom(peer.peer_id(), deadline, [&peer] { return peer.Health(); });
}

}  // namespace estuary::kvtransfer
