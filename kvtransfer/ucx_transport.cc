#include "kvtransfer/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"

namespace estuary::kvtransfer {
namespace {

constexpr unsigned kMessageAmId = 0x4b56;  // "KV"
// Puts posted without a flush before Put waits for the oldest (bounds UCX's pending queue).
constexpr size_t kMaxOutstandingPuts = 512;

// ---- RAII for the C handles (stateless deleters) ----
struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
struct ContextDeleter {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct WorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
struct RkeyDeleter {
  void operator()(ucp_rkey* r) const { ucp_rkey_destroy(r); }
};
using ConfigPtr = std::unique_ptr<ucp_config_t, ConfigDeleter>;
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;
using RkeyPtr = std::unique_ptr<ucp_rkey, RkeyDeleter>;

bool IsPeerFailure(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

absl::Status FromUcs(ucs_status_t s, std::string_view what) {
  if (s == UCS_OK) return absl::OkStatus();
  std::string msg = absl::StrCat("ucx ", std::string(what), ": ", ucs_status_string(s));
  if (IsPeerFailure(s)) return absl::UnavailableError(msg);
  if (s == UCS_ERR_NO_MEMORY || s == UCS_ERR_NO_RESOURCE || s == UCS_ERR_EXCEEDS_LIMIT) {
    return absl::ResourceExhaustedError(msg);
  }
  if (s == UCS_ERR_INVALID_PARAM || s == UCS_ERR_INVALID_ADDR) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace

// ---- Worker: context, worker, progress thread, inbox ----
// Members are declared in construction order; the destructor stops the thread, then the worker
// is destroyed before the context (reverse declaration order).
class UcxTransport::Worker {
 public:
  static absl::StatusOr<std::shared_ptr<Worker>> Create(const UcxTransportOptions& options) {
    auto w = std::shared_ptr<Worker>(new Worker(options));
    ESTUARY_RETURN_IF_ERROR(w->Init());
    return w;
  }

  ~Worker() {
    stop_.store(true);
    if (worker_ != nullptr) ucp_worker_signal(worker_.get());
    if (thread_.joinable()) thread_.join();
    // worker_ then context_ are released by their unique_ptrs.
  }

  const UcxTransportOptions& options() const { return options_; }
  ucp_context_h context() const { return context_.get(); }
  ucp_worker_h worker() const { return worker_.get(); }
  const std::string& address() const { return address_; }
  uint64_t id() const { return id_; }
  MessageInbox& inbox() { return inbox_; }

  // Progresses the worker until `req` completes, `deadline` passes or `*abort` becomes true
  // (then UNAVAILABLE); consumes the request.
  absl::Status Wait(ucs_status_ptr_t req, absl::Time deadline, std::string_view what,
                    const std::atomic<bool>* abort = nullptr) {
    if (req == nullptr) return absl::OkStatus();
    if (UCS_PTR_IS_ERR(req)) return FromUcs(UCS_PTR_STATUS(req), what);
    int idle = 0;
    while (true) {
      const unsigned progressed = ucp_worker_progress(worker_.get());
      const ucs_status_t s = ucp_request_check_status(req);
      if (s != UCS_INPROGRESS) {
        ucp_request_free(req);
        return FromUcs(s, what);
      }
      if (progressed == 0 && ++idle >= 64) {
        idle = 0;
        if (abort != nullptr && abort->load()) {
          ucp_request_free(req);
          return absl::UnavailableError(absl::StrCat("ucx ", std::string(what), ": peer failed"));
        }
        if (absl::Now() >= deadline) {
          ucp_request_free(req);  // released by UCX when it completes
          return absl::DeadlineExceededError(
              absl::StrCat("ucx ", std::string(what), ": deadline exceeded"));
        }
        std::this_thread::yield();
      }
    }
  }

 private:
  explicit Worker(const UcxTransportOptions& options) : options_(options) {}

  absl::Status Init() {
    ucp_config_t* raw_config = nullptr;
    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_config_read(nullptr, nullptr, &raw_config), "config read"));
    ConfigPtr config(raw_config);
    if (!options_.tls.empty()) {
      ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_config_modify(config.get(), "TLS", options_.tls.c_str()),
                                      absl::StrCat("set TLS=", options_.tls)));
    }
    if (options_.keepalive_interval > absl::ZeroDuration()) {
      const std::string v =
          absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive_interval), "ms");
      ESTUARY_RETURN_IF_ERROR(
          FromUcs(ucp_config_modify(config.get(), "KEEPALIVE_INTERVAL", v.c_str()),
                  "set KEEPALIVE_INTERVAL"));
    }
    for (const auto& [name, value] : options_.extra_config) {
      ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_config_modify(config.get(), name.c_str(), value.c_str()),
                                      absl::StrCat("set ", name, "=", value)));
    }

    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    ucp_context_h context = nullptr;
    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_init(&params, config.get(), &context), "init"));
    context_.reset(context);

    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_MULTI;
    ucp_worker_h worker = nullptr;
    ESTUARY_RETURN_IF_ERROR(
        FromUcs(ucp_worker_create(context_.get(), &wparams, &worker), "worker create"));
    worker_.reset(worker);
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    if (ucp_worker_query(worker_.get(), &attr) == UCS_OK &&
        attr.thread_mode != UCS_THREAD_MODE_MULTI) {
      return absl::InternalError("this UCX build has no multi-threaded worker support");
    }

    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    ESTUARY_RETURN_IF_ERROR(
        FromUcs(ucp_worker_get_address(worker_.get(), &addr, &addr_len), "get address"));
    address_.assign(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_.get(), addr);
    id_ = Transport::PeerId(address_);

    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kMessageAmId;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = &Worker::OnMessage;
    am.arg = this;
    ESTUARY_RETURN_IF_ERROR(
        FromUcs(ucp_worker_set_am_recv_handler(worker_.get(), &am), "set AM handler"));

    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_worker_get_efd(worker_.get(), &efd_), "get event fd"));
    thread_ = std::thread([this] { ProgressLoop(); });
    return absl::OkStatus();
  }

  // Runs under the worker lock, in whichever thread progresses the worker. Copies and returns.
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Worker*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      // Senders use eager messages only; a rendezvous message is not ours.
      ESTUARY_LOG(WARNING) << "ucx: dropping a rendezvous active message of " << length << " bytes";
      ucp_am_data_release(self->worker_.get(), data);
      return UCS_OK;
    }
    Message m;
    if (header_length == sizeof(uint64_t)) std::memcpy(&m.sender_id, header, sizeof(uint64_t));
    m.payload.assign(static_cast<const char*>(data), length);
    self->inbox_.Push(std::move(m));
    return UCS_OK;
  }

  void ProgressLoop() {
    while (!stop_.load(std::memory_order_relaxed)) {
      if (options_.busy_poll) {
        if (ucp_worker_progress(worker_.get()) == 0) std::this_thread::yield();
        continue;
      }
      while (ucp_worker_progress(worker_.get()) != 0) {
      }
      const ucs_status_t s = ucp_worker_arm(worker_.get());
      if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile
      pollfd pfd{efd_, POLLIN, 0};
      // The timeout is a safety net for transports without wakeup support.
      poll(&pfd, 1, s == UCS_OK ? 100 : 1);
      // Periodically let waiters re-check endpoint health.
      inbox_.Wake();
    }
  }

  const UcxTransportOptions options_;
  ContextPtr context_;
  WorkerPtr worker_;
  std::string address_;
  uint64_t id_ = 0;
  int efd_ = -1;
  MessageInbox inbox_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

namespace {

using Worker = UcxTransport::Worker;

// A ucp_mem_map'ed region. Owns the memory too when UCX allocated it.
class UcxRegion : public RegisteredRegion {
 public:
  static absl::StatusOr<std::unique_ptr<UcxRegion>> Map(std::shared_ptr<Worker> worker, void* data,
                                                        size_t bytes) {
    if (bytes == 0) return absl::InvalidArgumentError("cannot register an empty region");
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = data;
    p.length = bytes;
    if (data == nullptr) {
      p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      p.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucp_mem_h memh = nullptr;
    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_mem_map(worker->context(), &p, &memh), "mem map"));
    auto region = std::unique_ptr<UcxRegion>(new UcxRegion(worker, memh));
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_mem_query(memh, &attr), "mem query"));
    region->data_ = data != nullptr ? data : attr.address;
    region->bytes_ = bytes;
    if (data == nullptr) std::memset(region->data_, 0, bytes);
    void* rkey = nullptr;
    size_t rkey_size = 0;
    ESTUARY_RETURN_IF_ERROR(
        FromUcs(ucp_rkey_pack(worker->context(), memh, &rkey, &rkey_size), "rkey pack"));
    region->rkey_.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    return region;
  }

  ~UcxRegion() override {
    const ucs_status_t s = ucp_mem_unmap(worker_->context(), memh_);
    if (s != UCS_OK) ESTUARY_LOG(ERROR) << "ucp_mem_unmap: " << ucs_status_string(s);
  }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  RegionDescriptor Describe() const override {
    return RegionDescriptor{reinterpret_cast<uint64_t>(data_), bytes_, rkey_};
  }

 private:
  UcxRegion(std::shared_ptr<Worker> worker, ucp_mem_h memh)
      : worker_(std::move(worker)), memh_(memh) {}
  std::shared_ptr<Worker> worker_;
  ucp_mem_h memh_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::string rkey_;
};

class UcxRemoteRegion : public RemoteRegion {
 public:
  UcxRemoteRegion(uint64_t base, uint64_t bytes, RkeyPtr rkey)
      : base_(base), bytes_(bytes), rkey_(std::move(rkey)) {}
  uint64_t base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  ucp_rkey_h rkey() const { return rkey_.get(); }

 private:
  uint64_t base_, bytes_;
  RkeyPtr rkey_;
};

// Set by the UCX error callback (under the worker lock); read by any thread.
struct EndpointFailure {
  std::atomic<bool> failed{false};
  std::atomic<ucs_status_t> status{UCS_OK};
  MessageInbox* inbox = nullptr;
};

// A message in flight: UCX reads header and payload until the send completes.
struct PendingMessage {
  uint64_t header = 0;
  std::string payload;
};

class UcxEndpoint : public Endpoint {
 public:
  static absl::StatusOr<std::unique_ptr<UcxEndpoint>> Create(std::shared_ptr<Worker> worker,
                                                             std::string_view peer_address,
                                                             absl::Time deadline) {
    auto ep = std::unique_ptr<UcxEndpoint>(new UcxEndpoint(worker, peer_address));
    const UcxTransportOptions& options = worker->options();
    ESTUARY_ASSIGN_OR_RETURN(ep->ep_, ep->CreateEp(options.peer_error_handling));
    if (options.separate_data_endpoint) {
      ESTUARY_ASSIGN_OR_RETURN(ep->data_ep_, ep->CreateEp(/*peer_errors=*/false));
    } else {
      ep->data_ep_ = ep->ep_;
    }
    // Wire-up is asynchronous; a flush completes once the peer answered (or fails if it is gone).
    ESTUARY_RETURN_IF_ERROR(ep->FlushEp(ep->ep_, deadline));
    ESTUARY_RETURN_IF_ERROR(ep->Flush(deadline));
    if (logging::Verbosity() >= 2) {  // lanes and transports
      ucp_ep_print_info(ep->ep_, stderr);
      if (ep->data_ep_ != ep->ep_) ucp_ep_print_info(ep->data_ep_, stderr);
    }
    return ep;
  }

  ~UcxEndpoint() override {
    const bool failed = failure_->failed.load();
    if (data_ep_ != nullptr && !failed) {
      absl::Status s = Flush(absl::Now() + absl::Milliseconds(500));
      if (!s.ok()) {
        ESTUARY_VLOG(1) << "ucx endpoint close: " << s;
      }
    }
    for (ucs_status_ptr_t req : outstanding_) ucp_request_free(req);
    imported_.clear();  // rkeys before the endpoints
    if (data_ep_ != nullptr && data_ep_ != ep_) {
      // No peer-failure mode on this one: a graceful close, abandoned after a short wait when
      // the peer is gone (UCX then releases it with the worker).
      ucp_request_param_t p{};
      absl::Status s = worker_->Wait(ucp_ep_close_nbx(data_ep_, &p),
                                     absl::Now() + absl::Milliseconds(failed ? 10 : 500),
                                     "data ep close");
      if (!s.ok()) {
        ESTUARY_VLOG(1) << "ucx data endpoint close: " << s;
      }
    }
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      if (worker_->options().peer_error_handling) {
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      }
      absl::Status s = worker_->Wait(ucp_ep_close_nbx(ep_, &p), absl::Now() + absl::Seconds(1),
                                     "ep close");
      if (!s.ok() && !absl::IsUnavailable(s)) {
        ESTUARY_LOG(WARNING) << "ucx endpoint close: " << s;
        // The error callback may still fire: leak the small failure record rather than free it.
        return;
      }
    }
    delete failure_;
  }

  uint64_t peer_id() const override { return peer_id_; }

  absl::StatusOr<const RemoteRegion*> ImportRegion(const RegionDescriptor& region) override {
    ESTUARY_RETURN_IF_ERROR(Health());
    if (region.rkey.empty()) return absl::InvalidArgumentError("region descriptor has no rkey");
    ucp_rkey_h rkey = nullptr;
    ESTUARY_RETURN_IF_ERROR(
        FromUcs(ucp_ep_rkey_unpack(data_ep_, region.rkey.data(), &rkey), "rkey unpack"));
    imported_.push_back(
        std::make_unique<UcxRemoteRegion>(region.base, region.bytes, RkeyPtr(rkey)));
    return imported_.back().get();
  }

  absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst, uint64_t dst_offset,
                   absl::Time deadline) override {
    const auto& remote = static_cast<const UcxRemoteRegion&>(dst);
    if (dst_offset > remote.bytes() || bytes > remote.bytes() - dst_offset) {
      return absl::InvalidArgumentError(absl::StrCat("put of ", bytes, " bytes at offset ",
                                                     dst_offset, " overruns a remote region of ",
                                                     remote.bytes(), " bytes"));
    }
    ESTUARY_RETURN_IF_ERROR(Health());
    if (outstanding_.size() >= kMaxOutstandingPuts) {
      ucs_status_ptr_t oldest = outstanding_.front();
      outstanding_.pop_front();
      ESTUARY_RETURN_IF_ERROR(
          MapEpError(worker_->Wait(oldest, deadline, "put", &failure_->failed)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("ucx put: its deadline passed before it was posted");
    }
    ucp_request_param_t p{};
    ucs_status_ptr_t req = ucp_put_nbx(data_ep_, local, bytes, remote.base() + dst_offset,
                                       remote.rkey(), &p);
    if (req == nullptr) return absl::OkStatus();
    if (UCS_PTR_IS_ERR(req)) return MapEpError(FromUcs(UCS_PTR_STATUS(req), "put"));
    outstanding_.push_back(req);
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Time deadline) override {
    ESTUARY_RETURN_IF_ERROR(Health());
    absl::Status s = FlushEp(data_ep_, deadline);
    // After a completed flush every earlier put has completed too.
    absl::Status puts = absl::OkStatus();
    for (ucs_status_ptr_t req : outstanding_) {
      const ucs_status_t rs = ucp_request_check_status(req);
      if (rs != UCS_OK && rs != UCS_INPROGRESS && puts.ok()) puts = FromUcs(rs, "put");
      ucp_request_free(req);
    }
    outstanding_.clear();
    ESTUARY_RETURN_IF_ERROR(s);
    return MapEpError(puts);
  }

  absl::Status SendMessage(std::string_view payload, absl::Time deadline) override {
    if (payload.size() > Transport::kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("message of ", payload.size(), " bytes exceeds the limit"));
    }
    ESTUARY_RETURN_IF_ERROR(Health());
    auto* pending = new PendingMessage{worker_->id(), std::string(payload)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      delete static_cast<PendingMessage*>(user_data);
    };
    p.user_data = pending;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep_, kMessageAmId, &pending->header,
                                           sizeof(pending->header), pending->payload.data(),
                                           pending->payload.size(), &p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) delete pending;  // no callback in these cases
    return MapEpError(worker_->Wait(req, deadline, "send message", &failure_->failed));
  }

  absl::Status Health() const override {
    if (!failure_->failed.load()) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("ucx peer failed: ", ucs_status_string(failure_->status.load())));
  }

 private:
  UcxEndpoint(std::shared_ptr<Worker> worker, std::string_view peer_address)
      : worker_(std::move(worker)),
        peer_address_(peer_address),
        peer_id_(Transport::PeerId(peer_address)),
        failure_(new EndpointFailure) {
    failure_->inbox = &worker_->inbox();
  }

  absl::StatusOr<ucp_ep_h> CreateEp(bool peer_errors) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(peer_address_.data());
    p.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_handler.cb = &UcxEndpoint::OnError;
    p.err_handler.arg = failure_;
    ucp_ep_h handle = nullptr;
    ESTUARY_RETURN_IF_ERROR(FromUcs(ucp_ep_create(worker_->worker(), &p, &handle), "ep create"));
    return handle;
  }

  absl::Status FlushEp(ucp_ep_h ep, absl::Time deadline) {
    ucp_request_param_t p{};
    return MapEpError(worker_->Wait(ucp_ep_flush_nbx(ep, &p), deadline, "flush", &failure_->failed));
  }

  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* failure = static_cast<EndpointFailure*>(arg);
    failure->status.store(status);
    failure->failed.store(true);
    failure->inbox->Wake();
  }

  // Any error on an endpoint whose peer failed is reported as the peer failure.
  absl::Status MapEpError(absl::Status s) const {
    if (s.ok() || absl::IsDeadlineExceeded(s)) return s;
    if (failure_->failed.load()) return Health();
    return s;
  }

  std::shared_ptr<Worker> worker_;
  const std::string peer_address_;
  const uint64_t peer_id_;
  EndpointFailure* failure_;  // owned; see the destructor
  ucp_ep_h ep_ = nullptr;       // messages and liveness (peer error handling per options)
  ucp_ep_h data_ep_ = nullptr;  // puts and flushes; == ep_ unless separate_data_endpoint
  std::deque<ucs_status_ptr_t> outstanding_;
  // Declared after ep_ but cleared explicitly before the endpoint closes.
  std::vector<std::unique_ptr<UcxRemoteRegion>> imported_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(std::shared_ptr<Worker> worker, Worker::Create(options));
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(worker)));
}

UcxTransport::UcxTransport(std::shared_ptr<Worker> worker)
    : worker_(std::move(worker)), address_(worker_->address()) {}

UcxTransport::~UcxTransport() = default;

absl::StatusOr<std::unique_ptr<RegisteredRegion>> UcxTransport::RegisterRegion(void* data,
                                                                               size_t bytes) {
  if (data == nullptr) return absl::InvalidArgumentError("RegisterRegion needs memory");
  ESTUARY_ASSIGN_OR_RETURN(auto region, UcxRegion::Map(worker_, data, bytes));
  return std::unique_ptr<RegisteredRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> UcxTransport::AllocateRegion(size_t bytes) {
  ESTUARY_ASSIGN_OR_RETURN(auto region, UcxRegion::Map(worker_, nullptr, bytes));
  return std::unique_ptr<RegisteredRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<Endpoint>> UcxTransport::Connect(std::string_view peer_address,
                                                                absl::Time deadline) {
  if (peer_address.empty()) return absl::InvalidArgumentError("empty UCX peer address");
  ESTUARY_ASSIGN_OR_RETURN(auto ep, UcxEndpoint::Create(worker_, peer_address, deadline));
  return std::unique_ptr<Endpoint>(std::move(ep));
}

absl::StatusOr<Message> UcxTransport::PollMessage(absl::Time deadline) {
  return worker_->inbox().Pop(deadline);
}

absl::StatusOr<Message> UcxTransport::ReceiveFrom(const Endpoint& peer, absl::Time deadline) {
  return worker_->inbox().PopFrom(peer.peer_id(), deadline, [&peer] { return peer.Health(); });
}

}  // namespace estuary::kvtransfer
