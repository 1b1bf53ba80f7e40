#include "kvtransfer/nccl_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/poll_backoff.h"
#include "core/common/status_macros.h"
#include "kvtransfer/nccl_transport_wire.h"

namespace estuary::kvtransfer {
namespace {

using nccl::Frame;
using nccl::FrameStatus;
using nccl::FrameType;
using nccl::FrameTypeName;
using nccl::IsFrame;
using nccl::kProtocolVersion;
using nccl::ParseFrame;
using nccl::StatusFrame;
using nccl::Writer;

// A receiver without a flush from its sender still retires finished receives this often.
constexpr uint64_t kRetireEvery = 64;
// How often the dispatcher joins the threads of finished accepted connections.
constexpr absl::Duration kReapInterval = absl::Milliseconds(100);
// Slices of the waits that also watch for failures.
constexpr absl::Duration kPollSlice = absl::Milliseconds(20);
constexpr absl::Duration kAckSlice = absl::Milliseconds(5);

// Once an endpoint failed, every later call reports the failure as UNAVAILABLE (transport.h).
absl::Status AsUnavailable(const absl::Status& cause) {
  if (absl::IsUnavailable(cause)) return cause;
  return absl::UnavailableError(absl::StrCat("nccl endpoint failed: ", cause.ToString()));
}

absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// Registered memory. Kept alive by its RegisteredRegion handle and by the receives posted into it,
// so that memory the transport allocated is freed only after no receive can write into it.
struct RegionMemory {
  RegionMemory(std::shared_ptr<nccl::Backend> backend, void* data, size_t bytes, bool owned)
      : backend(std::move(backend)), data(static_cast<char*>(data)), bytes(bytes), owned(owned) {}
  ~RegionMemory() {
    if (owned) backend->Free(data);
  }
  std::shared_ptr<nccl::Backend> backend;
  char* const data;
  const size_t bytes;
  const bool owned;
};

// The sending end's state that the dispatcher updates from the receiver's frames.
struct OutConn {
  explicit OutConn(uint64_t peer_id) : peer_id(peer_id) {}
  const uint64_t peer_id;
  absl::Mutex mu;
  bool ready ABSL_GUARDED_BY(mu) = false;
  uint64_t sent ABSL_GUARDED_BY(mu) = 0;  // the last put header sent: no ACK may claim more
  uint64_t acked ABSL_GUARDED_BY(mu) = 0;
  absl::Status failure ABSL_GUARDED_BY(mu);  // the first cause; never cleared
};

class InConn;

}  // namespace

// ---------------------------------------------------------------------------------------------
// State: the control transport, the backend, the regions, the connections and the dispatcher.

class NcclTransport::State {
 public:
  State(std::unique_ptr<Transport> control, std::shared_ptr<nccl::Backend> backend,
        const NcclTransportOptions& options)
      : options_(options),
        control_(std::move(control)),
        backend_(std::move(backend)),
        address_(control_->Address()),
        id_(Transport::PeerId(address_)) {
    std::random_device rd;
    next_conn_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  ~State();

  void Start() {
    dispatcher_ = std::thread([this] { DispatchLoop(); });
  }
  void Shutdown();

  const NcclTransportOptions& options() const { return options_; }
  Transport& control() { return *control_; }
  nccl::Backend& backend() { return *backend_; }
  const std::shared_ptr<nccl::Backend>& shared_backend() const { return backend_; }
  const std::string& address() const { return address_; }
  uint64_t id() const { return id_; }
  MessageInbox& inbox() { return inbox_; }

  uint64_t NewConnId() {
    absl::MutexLock lock(&mu_);
    return ++next_conn_;
  }

  uint64_t AddRegion(std::shared_ptr<RegionMemory> memory) {
    absl::MutexLock lock(&mu_);
    const uint64_t key = ++next_region_;
    regions_[key] = std::move(memory);
    return key;
  }
  void RemoveRegion(uint64_t key) {
    std::shared_ptr<RegionMemory> last;  // released outside the lock (may free device memory)
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(key);
    if (it == regions_.end()) return;
    last = std::move(it->second);
    regions_.erase(it);
  }
  std::shared_ptr<RegionMemory> FindRegion(uint64_t key) {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(key);
    return it == regions_.end() ? nullptr : it->second;
  }

  // Returns false once the transport is shutting down (the connection then fails at once).
  bool AddOutgoing(uint64_t conn, const std::shared_ptr<OutConn>& out) {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return false;
    outgoing_[conn] = out;
    return true;
  }
  void RemoveOutgoing(uint64_t conn) {
    absl::MutexLock lock(&mu_);
    outgoing_.erase(conn);
  }

  size_t AcceptedConnections();

 private:
  void DispatchLoop();
  void Dispatch(Message m);
  void Reap();

  const NcclTransportOptions options_;
  const std::unique_ptr<Transport> control_;
  const std::shared_ptr<nccl::Backend> backend_;
  const std::string address_;
  const uint64_t id_;
  MessageInbox inbox_;  // user messages
  std::atomic<bool> stop_{false};
  std::thread dispatcher_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 0;
  // Registered regions by key. The RegisteredRegion handle removes its entry.
  absl::flat_hash_map<uint64_t, std::shared_ptr<RegionMemory>> regions_ ABSL_GUARDED_BY(mu_);
  // This transport's endpoints, by connection id (the endpoint removes its entry).
  absl::flat_hash_map<uint64_t, std::weak_ptr<OutConn>> outgoing_ ABSL_GUARDED_BY(mu_);
  // Connections peers made to this transport, by (sender id, connection id). Only the dispatcher
  // thread adds and removes entries (and Shutdown, after the dispatcher stopped).
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::unique_ptr<InConn>> accepted_
      ABSL_GUARDED_BY(mu_);
};

namespace {

using State = NcclTransport::State;

// ---------------------------------------------------------------------------------------------
// InConn: the receiving end of one connection, with its own thread. The thread connects back to
// the sender, joins the communicator as rank 1, answers READY, then takes PUT / FLUSH / CLOSE /
// ABORT frames in order: posts each put's ncclRecv, acks each flush once the receives before it
// completed. It ends on CLOSE (orderly close), ABORT, a dead sender, a failure, or Stop().

class InConn {
 public:
  InConn(State* state, uint64_t sender_id, Frame hello)
      : state_(state),
        sender_id_(sender_id),
        conn_(hello.conn),
        version_(hello.version),
        group_(std::move(hello.text)),
        sender_address_(std::move(hello.address)) {}
  ~InConn() {
    Stop();
    Join();
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Deliver(Frame f) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(f));
  }
  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool finished() const { return finished_.load(); }

 private:
  struct Retire {
    uint64_t seq;    // receives up to this put
    uint64_t token;  // link token after them
    bool ack;        // a FLUSH asked for it: send ACK when done
  };

  void Run() {
    bool tell_sender = true;
    absl::Status s = Setup(&tell_sender);
    if (s.ok()) s = Serve(&tell_sender);
    if (s.ok()) {
      ESTUARY_VLOG(1) << "nccl: connection " << conn_ << " from peer " << sender_id_ << " closed";
      link_->Close(absl::Now() + state_->options().close_timeout);
    } else {
      if (s == ShuttingDown()) {
        ESTUARY_VLOG(1) << "nccl: connection " << conn_ << " from peer " << sender_id_
                        << " ends with the transport";
      } else {
        ESTUARY_LOG(WARNING) << "nccl: connection " << conn_ << " from peer " << sender_id_
                             << " failed: " << s;
      }
      if (link_ != nullptr) link_->Abort();
      if (tell_sender && back_ != nullptr) {
        absl::Status r = back_->SendMessage(StatusFrame(FrameType::kFail, conn_, s),
                                            absl::Now() + state_->options().reply_timeout);
        if (!r.ok()) {
          ESTUARY_VLOG(1) << "nccl: could not send FAIL to peer " << sender_id_ << ": " << r;
        }
      }
    }
    link_.reset();
    in_flight_.clear();  // may free allocated regions whose handles are gone
    back_.reset();
    finished_.store(true);
  }

  // Frames that end the connection while it is being set up (or an enqueue waits), or Stop().
  static absl::Status ShuttingDown() {
    return absl::UnavailableError("the receiving NCCL transport is shutting down");
  }

  absl::Status CheckAbandoned(bool* tell_sender) {
    absl::MutexLock lock(&mu_);
    if (stop_) return ShuttingDown();
    for (const Frame& f : queue_) {
      if (f.type == FrameType::kAbort || f.type == FrameType::kClose) {
        *tell_sender = false;
        if (f.type == FrameType::kAbort) return FrameStatus(f, "sender");
        return absl::CancelledError("the sender closed the connection before it was set up");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Setup(bool* tell_sender) {
    const absl::Time deadline = absl::Now() + state_->options().accept_timeout;
    absl::StatusOr<std::unique_ptr<Endpoint>> back =
        state_->control().Connect(sender_address_, deadline);
    if (!back.ok()) {
      *tell_sender = false;
      return WithContext(back.status(), "nccl accept: connecting back to the sender");
    }
    back_ = std::move(*back);
    if (version_ != kProtocolVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("the sender speaks NCCL transport protocol version ", version_,
                       ", the receiver version ", kProtocolVersion));
    }
    absl::StatusOr<std::unique_ptr<nccl::Link>> link = state_->backend().StartLink(group_, 1);
    if (!link.ok()) return WithContext(link.status(), "nccl accept: joining the communicator");
    link_ = std::move(*link);
    int polls = 0;
    while (true) {
      ESTUARY_ASSIGN_OR_RETURN(const bool busy, link_->InProgress());
      if (!busy) break;
      ESTUARY_RETURN_IF_ERROR(CheckAbandoned(tell_sender));
      if (absl::Status h = back_->Health(); !h.ok()) {
        *tell_sender = false;
        return WithContext(h, "nccl accept: the sender went away");
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "nccl accept: the communicator with peer ", sender_id_, " was not ready within ",
            absl::FormatDuration(state_->options().accept_timeout)));
      }
      PollBackoff(&polls);
    }
    return WithContext(back_->SendMessage(Writer(FrameType::kReady).U64(conn_).Take(),
                                          absl::Now() + state_->options().reply_timeout),
                       "nccl accept: sending READY");
  }

  absl::Status Serve(bool* tell_sender) {
    int polls = 0;
    while (true) {
      std::deque<Frame> batch;
      bool stop = false;
      {
        absl::MutexLock lock(&mu_);
        if (queue_.empty() && retire_.empty()) {
          auto wake = [this]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
          mu_.AwaitWithDeadline(absl::Condition(&wake), absl::Now() + kPollSlice);
        }
        batch.swap(queue_);
        stop = stop_;
      }
      // Frames that arrived before a shutdown are still handled (a CLOSE ends in an orderly
      // close).
      for (Frame& f : batch) {
        bool closed = false;
        ESTUARY_RETURN_IF_ERROR(Handle(f, &closed, tell_sender));
        if (closed) return absl::OkStatus();
        polls = 0;
      }
      if (stop) return ShuttingDown();
      while (!retire_.empty()) {
        ESTUARY_ASSIGN_OR_RETURN(const bool done, link_->Done(retire_.front().token));
        if (!done) break;
        const Retire r = retire_.front();
        retire_.pop_front();
        while (!in_flight_.empty() && in_flight_.front().first <= r.seq) in_flight_.pop_front();
        if (r.ack) {
          ESTUARY_RETURN_IF_ERROR(
              WithContext(back_->SendMessage(Writer(FrameType::kAck).U64(conn_).U64(r.seq).Take(),
                                             absl::Now() + state_->options().reply_timeout),
                          "nccl: sending ACK"));
        }
      }
      if (absl::Status h = back_->Health(); !h.ok()) {
        *tell_sender = false;
        return WithContext(h, "nccl: the sender went away");
      }
      if (retire_.empty()) {
        // Idle: still surface NCCL asynchronous errors.
        ESTUARY_RETURN_IF_ERROR(link_->InProgress().status());
      } else {
        PollBackoff(&polls);
      }
    }
  }

  absl::Status Handle(const Frame& f, bool* closed, bool* tell_sender) {
    switch (f.type) {
      case FrameType::kPut: {
        if (f.seq != posted_ + 1) {
          return absl::InternalError(absl::StrCat("nccl protocol: put ", f.seq, " after put ",
                                                  posted_, " (lost or reordered header)"));
        }
        std::shared_ptr<RegionMemory> region = state_->FindRegion(f.key);
        if (region == nullptr) {
          return absl::FailedPreconditionError(
              absl::StrCat("put ", f.seq, " into region key ", f.key,
                           ", which the receiver has not registered (deregistered while in use?)"));
        }
        if (f.offset > region->bytes || f.bytes > region->bytes - f.offset) {
          return absl::InvalidArgumentError(
              absl::StrCat("put ", f.seq, " of ", f.bytes, " bytes at offset ", f.offset,
                           " overruns the receiver's region of ", region->bytes, " bytes"));
        }
        ESTUARY_RETURN_IF_ERROR(link_->Recv(region->data + f.offset, f.bytes));
        ESTUARY_RETURN_IF_ERROR(WaitEnqueued(tell_sender));
        posted_ = f.seq;
        in_flight_.emplace_back(f.seq, std::move(region));
        if (posted_ - last_marked_ >= kRetireEvery) {
          ESTUARY_RETURN_IF_ERROR(MarkRetire(/*ack=*/false));
        }
        return absl::OkStatus();
      }
      case FrameType::kFlush:
        if (f.seq > posted_) {
          return absl::InternalError(absl::StrCat("nccl protocol: flush up to put ", f.seq,
                                                  " but only ", posted_, " puts arrived"));
        }
        return MarkRetire(/*ack=*/true);
      case FrameType::kClose:
        *closed = true;
        return absl::OkStatus();
      case FrameType::kAbort:
        *tell_sender = false;
        return FrameStatus(f, "sender");
      default:
        return absl::InternalError(absl::StrCat("nccl protocol: unexpected ", FrameTypeName(f.type),
                                                " frame from the sender"));
    }
  }

  absl::Status MarkRetire(bool ack) {
    ESTUARY_ASSIGN_OR_RETURN(const uint64_t token, link_->Mark());
    retire_.push_back(Retire{posted_, token, ack});
    last_marked_ = posted_;
    return absl::OkStatus();
  }

  // A non-blocking enqueue may still be in progress (the first one also connects the two ranks):
  // the next NCCL call has to wait for it.
  absl::Status WaitEnqueued(bool* tell_sender) {
    const absl::Time deadline = absl::Now() + state_->options().accept_timeout;
    int polls = 0;
    while (true) {
      ESTUARY_ASSIGN_OR_RETURN(const bool busy, link_->InProgress());
      if (!busy) return absl::OkStatus();
      ESTUARY_RETURN_IF_ERROR(CheckAbandoned(tell_sender));
      if (absl::Status h = back_->Health(); !h.ok()) {
        *tell_sender = false;
        return WithContext(h, "nccl: the sender went away");
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("nccl: enqueuing a receive did not finish in time");
      }
      PollBackoff(&polls);
    }
  }

  State* const state_;  // outlives this connection (State::Shutdown joins the thread)
  const uint64_t sender_id_;
  const uint64_t conn_;
  const uint32_t version_;  // the sender's protocol version
  const std::string group_;
  const std::string sender_address_;

  absl::Mutex mu_;
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> finished_{false};
  std::thread thread_;

  // Owned by the thread.
  std::unique_ptr<Endpoint> back_;  // control endpoint to the sender (READY, ACK, FAIL)
  std::unique_ptr<nccl::Link> link_;
  uint64_t posted_ = 0;       // last put whose receive is enqueued
  uint64_t last_marked_ = 0;  // last put covered by a retire marker
  std::deque<Retire> retire_;
  std::deque<std::pair<uint64_t, std::shared_ptr<RegionMemory>>> in_flight_;
};

}  // namespace

NcclTransport::State::~State() { Shutdown(); }

void NcclTransport::State::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  stop_.store(true);
  if (dispatcher_.joinable()) dispatcher_.join();
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::unique_ptr<InConn>> accepted;
  std::vector<std::shared_ptr<OutConn>> outgoing;
  {
    absl::MutexLock lock(&mu_);
    accepted.swap(accepted_);
    for (auto& [conn, weak] : outgoing_) {
      if (std::shared_ptr<OutConn> out = weak.lock()) outgoing.push_back(std::move(out));
    }
  }
  for (auto& [key, in] : accepted) in->Stop();
  accepted.clear();  // joins
  for (const std::shared_ptr<OutConn>& out : outgoing) {
    absl::MutexLock lock(&out->mu);
    if (out->failure.ok()) {
      out->failure = absl::UnavailableError("the local NCCL transport was shut down");
    }
  }
  inbox_.Wake();
}

size_t NcclTransport::State::AcceptedConnections() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, in] : accepted_) n += in->finished() ? 0 : 1;
  return n;
}

void NcclTransport::State::DispatchLoop() {
  absl::Time next_reap = absl::Now() + kReapInterval;
  absl::Time next_error_log = absl::InfinitePast();
  while (!stop_.load()) {
    absl::StatusOr<Message> m = control_->PollMessage(absl::Now() + kPollSlice);
    if (m.ok()) {
      Dispatch(*std::move(m));
    } else if (!absl::IsDeadlineExceeded(m.status())) {
      if (absl::Now() >= next_error_log) {
        ESTUARY_LOG(WARNING) << "nccl: polling the control transport failed: " << m.status();
        next_error_log = absl::Now() + absl::Seconds(10);
      }
      absl::SleepFor(kPollSlice);  // do not spin on a persistent error
    }
    if (absl::Now() >= next_reap) {
      Reap();
      next_reap = absl::Now() + kReapInterval;
    }
  }
}

void NcclTransport::State::Reap() {
  std::vector<std::unique_ptr<InConn>> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = accepted_.begin(); it != accepted_.end();) {
      if (it->second->finished()) {
        done.push_back(std::move(it->second));
        accepted_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  done.clear();  // joins, outside the lock
}

void NcclTransport::State::Dispatch(Message m) {
  if (!IsFrame(m.payload)) {
    inbox_.Push(std::move(m));
    return;
  }
  absl::StatusOr<Frame> parsed = ParseFrame(m.payload);
  if (!parsed.ok()) {
    ESTUARY_LOG(WARNING) << "nccl: dropping a message from peer " << m.sender_id << ": "
                         << parsed.status();
    return;
  }
  Frame& f = *parsed;
  switch (f.type) {
    case FrameType::kUser:
      inbox_.Push(Message{m.sender_id, std::move(f.text)});
      return;
    case FrameType::kHello: {
      if (Transport::PeerId(f.address) != m.sender_id) {
        ESTUARY_LOG(WARNING) << "nccl: HELLO from peer " << m.sender_id
                             << " names an address of another transport; ignoring it";
        return;
      }
      const auto key = std::make_pair(m.sender_id, f.conn);
      absl::MutexLock lock(&mu_);
      if (shut_down_ || accepted_.contains(key)) return;
      ESTUARY_VLOG(1) << "nccl: accepting connection " << f.conn << " from peer " << m.sender_id;
      auto in = std::make_unique<InConn>(this, m.sender_id, std::move(f));
      in->Start();
      accepted_.emplace(key, std::move(in));
      return;
    }
    case FrameType::kPut:
    case FrameType::kFlush:
    case FrameType::kClose:
    case FrameType::kAbort: {
      absl::MutexLock lock(&mu_);
      auto it = accepted_.find(std::make_pair(m.sender_id, f.conn));
      if (it == accepted_.end() || it->second->finished()) {
        ESTUARY_VLOG(1) << "nccl: " << FrameTypeName(f.type) << " for unknown connection " << f.conn
                        << " from peer " << m.sender_id;
        return;
      }
      it->second->Deliver(std::move(f));
      return;
    }
    case FrameType::kReady:
    case FrameType::kAck:
    case FrameType::kFail: {
      std::shared_ptr<OutConn> out;
      {
        absl::MutexLock lock(&mu_);
        auto it = outgoing_.find(f.conn);
        if (it != outgoing_.end()) out = it->second.lock();
      }
      if (out == nullptr || out->peer_id != m.sender_id) {
        ESTUARY_VLOG(1) << "nccl: " << FrameTypeName(f.type) << " for unknown connection " << f.conn
                        << " from peer " << m.sender_id;
        return;
      }
      {
        absl::MutexLock lock(&out->mu);
        if (f.type == FrameType::kAck && f.seq > out->sent) {
          // An ACK for puts never sent would let a flush return before its data landed.
          ESTUARY_LOG(WARNING) << "nccl: ACK of put " << f.seq << " from peer " << m.sender_id
                               << ", which was sent only " << out->sent << "; ignoring it";
          return;
        }
        if (f.type == FrameType::kReady) out->ready = true;
        if (f.type == FrameType::kAck) out->acked = std::max(out->acked, f.seq);
        if (f.type == FrameType::kFail && out->failure.ok())
          out->failure = FrameStatus(f, "receiver");
      }
      if (f.type == FrameType::kFail) inbox_.Wake();
      return;
    }
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Regions

class NcclRegion : public RegisteredRegion {
 public:
  NcclRegion(std::shared_ptr<State> state, uint64_t key, std::shared_ptr<RegionMemory> memory)
      : state_(std::move(state)), key_(key), memory_(std::move(memory)) {}
  ~NcclRegion() override { state_->RemoveRegion(key_); }
  void* data() const override { return memory_->data; }
  size_t bytes() const override { return memory_->bytes; }
  RegionDescriptor Describe() const override {
    return RegionDescriptor{reinterpret_cast<uint64_t>(memory_->data), memory_->bytes,
                            nccl::EncodeRkey(state_->id(), key_)};
  }

 private:
  std::shared_ptr<State> state_;
  const uint64_t key_;
  std::shared_ptr<RegionMemory> memory_;
};

class NcclRemoteRegion : public RemoteRegion {
 public:
  NcclRemoteRegion(uint64_t base, uint64_t bytes, uint64_t key)
      : base_(base), bytes_(bytes), key_(key) {}
  uint64_t base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  uint64_t key() const { return key_; }

 private:
  const uint64_t base_, bytes_, key_;
};

// ---------------------------------------------------------------------------------------------
// NcclEndpoint: the sending end (rank 0) of one connection.

class NcclEndpoint : public Endpoint {
 public:
  static absl::StatusOr<std::unique_ptr<NcclEndpoint>> Connect(std::shared_ptr<State> state,
                                                               std::string_view peer_address,
                                                               absl::Time deadline) {
    ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> control,
                             state->control().Connect(peer_address, deadline));
    const uint64_t conn = state->NewConnId();
    auto out = std::make_shared<OutConn>(control->peer_id());
    std::unique_ptr<NcclEndpoint> ep(new NcclEndpoint(state, std::move(control), conn, out));
    if (!state->AddOutgoing(conn, out)) {
      return absl::UnavailableError("nccl connect: the local NCCL transport is shutting down");
    }
    ESTUARY_RETURN_IF_ERROR(ep->Setup(deadline));
    return ep;
  }

  ~NcclEndpoint() override {
    bool healthy = false;
    {
      absl::MutexLock lock(&out_->mu);
      healthy = out_->failure.ok() && out_->ready;
    }
    if (healthy && link_ != nullptr && !aborted_) {
      const absl::Time deadline = absl::Now() + state_->options().close_timeout;
      absl::Status s = Flush(deadline);  // aborts and tells the peer on failure
      if (s.ok()) {
        s = control_->SendMessage(Writer(FrameType::kClose).U64(conn_).Take(), deadline);
        if (s.ok()) {
          link_->Close(deadline);
        } else {
          Abort(s);
        }
      }
      if (!s.ok()) {
        ESTUARY_VLOG(1) << "nccl endpoint close: " << s;
      }
    } else if (link_ != nullptr && !aborted_) {
      Abort(absl::UnavailableError("endpoint closed after a failure"));
    }
    link_.reset();
    imported_.clear();
    control_.reset();
    state_->RemoveOutgoing(conn_);
  }

  uint64_t peer_id() const override { return peer_id_; }

  absl::StatusOr<const RemoteRegion*> ImportRegion(const RegionDescriptor& region) override {
    ESTUARY_RETURN_IF_ERROR(CheckUsable());
    uint64_t owner = 0, key = 0;
    ESTUARY_RETURN_IF_ERROR(nccl::DecodeRkey(region.rkey, &owner, &key));
    if (owner != peer_id_) {
      return absl::InvalidArgumentError(absl::StrCat("the region descriptor belongs to transport ",
                                                     owner, ", not to this endpoint's peer ",
                                                     peer_id_));
    }
    imported_.push_back(std::make_unique<NcclRemoteRegion>(region.base, region.bytes, key));
    return imported_.back().get();
  }

  absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst, uint64_t dst_offset,
                   absl::Time deadline) override {
    const auto& remote = static_cast<const NcclRemoteRegion&>(dst);
    if (dst_offset > remote.bytes() || bytes > remote.bytes() - dst_offset) {
      return absl::InvalidArgumentError(absl::StrCat("put of ", bytes, " bytes at offset ",
                                                     dst_offset, " overruns a remote region of ",
                                                     remote.bytes(), " bytes"));
    }
    if (bytes > 0) {
      ESTUARY_RETURN_IF_ERROR(state_->backend().CheckMemory(local, bytes, "put source"));
    }
    ESTUARY_RETURN_IF_ERROR(CheckUsable());
    if (bytes == 0) return absl::OkStatus();
    if (outstanding_.size() >= std::max<size_t>(1, state_->options().max_outstanding_puts)) {
      const uint64_t oldest = outstanding_.front();
      ESTUARY_RETURN_IF_ERROR(Wait("put (waiting for an earlier put)", deadline,
                                   [&]() { return link_->Done(oldest); }));
      outstanding_.pop_front();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("nccl put: its deadline passed before it was posted");
    }
    const uint64_t seq = last_seq_ + 1;
    absl::Status s = control_->SendMessage(Writer(FrameType::kPut)
                                               .U64(conn_)
                                               .U64(seq)
                                               .U64(remote.key())
                                               .U64(dst_offset)
                                               .U64(bytes)
                                               .Take(),
                                           deadline);
    // Whether the header arrived is unknown: the two ends may disagree from here on.
    if (!s.ok()) return Fail(WithContext(s, "nccl put: sending the put header"));
    last_seq_ = seq;
    {
      absl::MutexLock lock(&out_->mu);
      out_->sent = seq;
    }
    s = link_->Send(local, bytes);
    if (!s.ok()) return Fail(WithContext(s, "nccl put: ncclSend"));
    ESTUARY_RETURN_IF_ERROR(
        Wait("put (enqueuing ncclSend)", deadline, [&]() -> absl::StatusOr<bool> {
          ESTUARY_ASSIGN_OR_RETURN(const bool busy, link_->InProgress());
          return !busy;
        }));
    absl::StatusOr<uint64_t> token = link_->Mark();
    if (!token.ok()) return Fail(WithContext(token.status(), "nccl put"));
    outstanding_.push_back(*token);
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Time deadline) override {
    ESTUARY_RETURN_IF_ERROR(CheckUsable());
    uint64_t acked = 0;
    {
      absl::MutexLock lock(&out_->mu);
      acked = out_->acked;
    }
    if (acked < last_seq_) {
      const uint64_t target = last_seq_;
      absl::Status s =
          control_->SendMessage(Writer(FrameType::kFlush).U64(conn_).U64(target).Take(), deadline);
      if (!s.ok()) return Fail(WithContext(s, "nccl flush: sending FLUSH"));
      ESTUARY_RETURN_IF_ERROR(Wait(
          "flush (waiting for the receiver's ack)", deadline,
          [&]() -> absl::StatusOr<bool> {
            ESTUARY_RETURN_IF_ERROR(link_->InProgress().status());  // asynchronous errors
            absl::MutexLock lock(&out_->mu);
            return out_->acked >= target;
          },
          /*ack_target=*/target));
    }
    if (!outstanding_.empty()) {
      // The receiver has everything, so the sends are done or about to be: wait for them, so
      // that the caller may reuse its buffers.
      const uint64_t last = outstanding_.back();
      ESTUARY_RETURN_IF_ERROR(
          Wait("flush (waiting for the sends)", deadline, [&]() { return link_->Done(last); }));
      outstanding_.clear();
    }
    return absl::OkStatus();
  }

  absl::Status SendMessage(std::string_view payload, absl::Time deadline) override {
    if (payload.size() > Transport::kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("message of ", payload.size(), " bytes exceeds the limit"));
    }
    ESTUARY_RETURN_IF_ERROR(CheckUsable());
    if (!IsFrame(payload)) return control_->SendMessage(payload, deadline);
    std::string escaped = Writer(FrameType::kUser).Raw(payload).Take();
    if (escaped.size() > Transport::kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("message of ", payload.size(),
                       " bytes starts with the NCCL transport's reserved "
                       "prefix and is too long to escape"));
    }
    return control_->SendMessage(escaped, deadline);
  }

  absl::Status Health() const override {
    {
      absl::MutexLock lock(&out_->mu);
      if (!out_->failure.ok()) return AsUnavailable(out_->failure);
    }
    return control_->Health();
  }

 private:
  NcclEndpoint(std::shared_ptr<State> state, std::unique_ptr<Endpoint> control, uint64_t conn,
               std::shared_ptr<OutConn> out)
      : state_(std::move(state)),
        control_(std::move(control)),
        conn_(conn),
        peer_id_(control_->peer_id()),
        out_(std::move(out)) {}

  absl::Status Setup(absl::Time deadline) {
    absl::StatusOr<std::string> group = state_->backend().NewGroupId();
    if (!group.ok()) return Fail(WithContext(group.status(), "nccl connect"), false);
    absl::Status s = control_->SendMessage(Writer(FrameType::kHello)
                                               .U64(conn_)
                                               .U32(kProtocolVersion)
                                               .Str(*group)
                                               .Str(state_->address())
                                               .Take(),
                                           deadline);
    if (!s.ok()) return Fail(WithContext(s, "nccl connect: sending HELLO"), false);
    absl::StatusOr<std::unique_ptr<nccl::Link>> link = state_->backend().StartLink(*group, 0);
    if (!link.ok()) {
      // The peer may be joining already: tell it to stop.
      SendAbort(link.status());
      return Fail(WithContext(link.status(), "nccl connect: joining the communicator"), false);
    }
    link_ = std::move(*link);
    bool ready = false;
    s = Wait("connect", deadline, [&]() -> absl::StatusOr<bool> {
      ESTUARY_ASSIGN_OR_RETURN(const bool busy, link_->InProgress());
      absl::MutexLock lock(&out_->mu);
      ready = out_->ready;
      return !busy && ready;
    });
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("nccl connect to peer ", peer_id_, ": ",
                       ready ? "the peer answered READY but this side's communicator was not ready"
                             : "no READY from the peer (is it an NcclTransport, on another GPU?)",
                       " by the deadline; the communicator was aborted"));
    }
    return s;
  }

  // Polls `done` until it is true; fails the endpoint on an error, on a failure of the peer and
  // when `deadline` passes (NCCL work is in flight, so the communicator is aborted). With an
  // `ack_target`, sleeps on the ack instead of backing off.
  absl::Status Wait(const char* what, absl::Time deadline,
                    absl::FunctionRef<absl::StatusOr<bool>()> done, uint64_t ack_target = 0) {
    int polls = 0;
    while (true) {
      absl::StatusOr<bool> d = done();
      if (!d.ok()) return Fail(WithContext(d.status(), absl::StrCat("nccl ", what)));
      if (*d) return absl::OkStatus();
      ESTUARY_RETURN_IF_ERROR(CheckUsable());
      if (absl::Now() >= deadline) {
        return Fail(absl::DeadlineExceededError(
            absl::StrCat("nccl ", what,
                         ": deadline exceeded with NCCL work in flight; the endpoint's "
                         "communicator was aborted")));
      }
      if (ack_target > 0) {
        absl::MutexLock lock(&out_->mu);
        auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_->mu) {
          return out_->acked >= ack_target || !out_->failure.ok();
        };
        out_->mu.AwaitWithDeadline(absl::Condition(&arrived),
                                   std::min(deadline, absl::Now() + kAckSlice));
      } else {
        PollBackoff(&polls);
      }
    }
  }

  // OK while usable. Otherwise aborts the communicator (once) and returns UNAVAILABLE.
  absl::Status CheckUsable() {
    absl::Status failure;
    {
      absl::MutexLock lock(&out_->mu);
      failure = out_->failure;
    }
    if (!failure.ok()) {
      if (link_ != nullptr && !aborted_) {
        link_->Abort();
        aborted_ = true;
      }
      return AsUnavailable(failure);
    }
    if (absl::Status h = control_->Health(); !h.ok()) {
      return Fail(
          absl::UnavailableError(absl::StrCat("nccl peer ", peer_id_, " is gone: ", h.message())),
          /*tell_peer=*/false);
    }
    return absl::OkStatus();
  }

  // Records `cause` as the endpoint's failure (the first one is kept), aborts the communicator and
  // (best effort) tells the peer. Returns `cause`.
  absl::Status Fail(absl::Status cause, bool tell_peer = true) {
    {
      absl::MutexLock lock(&out_->mu);
      if (out_->failure.ok()) out_->failure = cause;
    }
    if (link_ != nullptr && !aborted_) {
      link_->Abort();
      aborted_ = true;
      if (tell_peer) SendAbort(cause);
    }
    state_->inbox().Wake();
    return cause;
  }

  void Abort(const absl::Status& cause) { (void)Fail(cause); }

  void SendAbort(const absl::Status& cause) {
    absl::Status s = control_->SendMessage(StatusFrame(FrameType::kAbort, conn_, cause),
                                           absl::Now() + state_->options().close_timeout);
    if (!s.ok()) {
      ESTUARY_VLOG(1) << "nccl: could not send ABORT to peer " << peer_id_ << ": " << s;
    }
  }

  // Members in teardown order (the destructor releases link and control explicitly).
  std::shared_ptr<State> state_;
  std::unique_ptr<Endpoint> control_;
  const uint64_t conn_;
  const uint64_t peer_id_;
  std::shared_ptr<OutConn> out_;
  std::unique_ptr<nccl::Link> link_;
  bool aborted_ = false;
  uint64_t last_seq_ = 0;             // the last put's sequence number (puts count from 1)
  std::deque<uint64_t> outstanding_;  // link tokens of puts not known to be sent
  std::vector<std::unique_ptr<NcclRemoteRegion>> imported_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// NcclTransport

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    std::unique_ptr<Transport> control, const NcclTransportOptions& options) {
  if (control == nullptr) {
    return absl::InvalidArgumentError("NcclTransport needs a control transport");
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclTransport: CUDA device ", options.device, " is not a device number"));
  }
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<nccl::Backend> backend,
                           nccl::MakeCudaNcclBackend(options.device));
  return CreateWithBackend(std::move(control), std::move(backend), options);
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::CreateWithBackend(
    std::unique_ptr<Transport> control, std::unique_ptr<nccl::Backend> backend,
    const NcclTransportOptions& options) {
  if (control == nullptr) {
    return absl::InvalidArgumentError("NcclTransport needs a control transport");
  }
  if (backend == nullptr) return absl::InvalidArgumentError("NcclTransport needs a backend");
  if (options.accept_timeout <= absl::ZeroDuration() ||
      options.reply_timeout <= absl::ZeroDuration() ||
      options.close_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "NcclTransport: accept_timeout, reply_timeout and close_timeout must be positive");
  }
  auto state = std::make_shared<State>(std::move(control), std::move(backend), options);
  state->Start();
  ESTUARY_VLOG(1) << "nccl transport on " << state->backend().Describe();
  return std::unique_ptr<NcclTransport>(new NcclTransport(std::move(state)));
}

NcclTransport::NcclTransport(std::shared_ptr<State> state)
    : state_(std::move(state)), address_(state_->address()) {}

NcclTransport::~NcclTransport() { state_->Shutdown(); }

absl::StatusOr<std::unique_ptr<RegisteredRegion>> NcclTransport::RegisterRegion(void* data,
                                                                                size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("RegisterRegion needs a non-empty region");
  }
  ESTUARY_RETURN_IF_ERROR(state_->backend().CheckMemory(data, bytes, "region"));
  auto memory =
      std::make_shared<RegionMemory>(state_->shared_backend(), data, bytes, /*owned=*/false);
  const uint64_t key = state_->AddRegion(memory);
  return std::unique_ptr<RegisteredRegion>(new NcclRegion(state_, key, std::move(memory)));
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> NcclTransport::AllocateRegion(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateRegion needs bytes > 0");
  ESTUARY_ASSIGN_OR_RETURN(void* data, state_->backend().Allocate(bytes));
  auto memory =
      std::make_shared<RegionMemory>(state_->shared_backend(), data, bytes, /*owned=*/true);
  const uint64_t key = state_->AddRegion(memory);
  return std::unique_ptr<RegisteredRegion>(new NcclRegion(state_, key, std::move(memory)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> NcclTransport::Connect(std::string_view peer_address,
                                                                 absl::Time deadline) {
  if (peer_address.empty()) return absl::InvalidArgumentError("empty NCCL peer address");
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<NcclEndpoint> ep,
                           NcclEndpoint::Connect(state_, peer_address, deadline));
  return std::unique_ptr<Endpoint>(std::move(ep));
}

absl::StatusOr<Message> NcclTransport::PollMessage(absl::Time deadline) {
  return state_->inbox().Pop(deadline);
}

absl::StatusOr<Message> NcclTransport::ReceiveFrom(const Endpoint& peer, absl::Time deadline) {
  return state_->inbox().PopFrom(peer.peer_id(), deadline, [&peer] { return peer.Health(); });
}

size_t NcclTransport::accepted_connections() const { return state_->AcceptedConnections(); }

}  // namespace estuary::kvtransfer
