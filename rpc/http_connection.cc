#include "rpc/http_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/http/error.hpp"
// GCC 12 misreads boost::optional in Beast 1.74's parser as maybe uninitialized (sanitizer and
// debug builds); the warning is about Boost's lines, not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "boost/beast/http/parser.hpp"
#pragma GCC diagnostic pop
#include "boost/beast/http/string_body.hpp"
#include "rpc/http_responder.h"
#include "rpc/http_wire.h"

namespace estuary::rpc {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Reads ask for this much while no body is under way (an idle or monitoring connection keeps
// only this buffer), and for more while a body streams in.
constexpr size_t kSmallReadBytes = size_t{4} << 10;
constexpr size_t kBodyReadBytes = size_t{64} << 10;
// Bytes of pipelined requests kept while an answer is under way; beyond, reading pauses (the
// client's own buffers hold the rest) until the answer is written.
constexpr size_t kMaxPipelinedBytes = size_t{64} << 10;
// After an answer that closes the connection (an error, a body refused), what the client still
// sends is read and dropped, up to this much, so that it sees the answer rather than a reset.
constexpr size_t kMaxLingerBytes = size_t{64} << 20;
constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(d));
}

std::string Str(beast::string_view text) { return std::string(text.data(), text.size()); }

HttpRequest ToRequest(http::request<http::string_body>&& message) {
  HttpRequest request;
  // HEAD is served as GET; the responder leaves the body out.
  request.method =
      message.method() == http::verb::head ? std::string("GET") : Str(message.method_string());
  request.target = Str(message.target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : message) {
    request.headers.emplace_back(Str(field.name_string()), Str(field.value()));
  }
  request.body = std::move(message.body());
  return request;
}

// One connection over `Stream`: tcp::socket (HTTP) or ssl::stream<tcp::socket> (HTTPS). Every
// member without a lock is touched only on the connection's executor (a strand); the output
// queue and the client-gone state are shared with responders on handler threads under mu_.
template <class Stream>
class StreamConnection final : public HttpConnection,
                               public std::enable_shared_from_this<StreamConnection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  // `stream_args` construct the stream (an ssl::stream is built in place).
  template <class... StreamArgs>
  explicit StreamConnection(std::shared_ptr<HttpServing> serving, StreamArgs&&... stream_args)
      : serving_(std::move(serving)),
        options_(serving_->options),
        stream_(std::forward<StreamArgs>(stream_args)...),
        executor_(stream_.get_executor()),
        read_timer_(executor_),
        write_timer_(executor_) {}

  ~StreamConnection() override { serving_->Closed(this); }

  void Begin() {
    serving_->Opened(this, this->weak_from_this());
    asio::dispatch(executor_, [self = this->shared_from_this()] { self->Open(); });
  }

  bool Enqueue(uint64_t answer, std::string bytes, bool last, bool close_after,
               bool wait) override {
    absl::MutexLock lock(&mu_);
    if (gone_ || answer == 0 || answer != open_answer_ || last_queued_) return false;
    if (last) {
      last_queued_ = true;
      close_after_ = close_after;
    }
    QueueLocked(bytes, last);
    if (wait) {
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return gone_ || pending_.size() + in_flight_ <= kMaxQueuedBytes;
      };
      mu_.Await(absl::Condition(&room));
    }
    return !gone_;
  }

  void SetOnGone(uint64_t answer, std::function<void()> on_gone) override {
    absl::MutexLock lock(&mu_);
    if (answer != open_answer_) return;
    if (gone_) {
      if (on_gone) on_gone();
      return;
    }
    on_gone_ = std::move(on_gone);
  }

  bool Gone() override {
    absl::MutexLock lock(&mu_);
    return gone_;
  }

  void Abort() override {
    {
      absl::MutexLock lock(&mu_);
      MarkGoneLocked();
    }
    asio::post(executor_, [self = this->shared_from_this()] { self->Close(); });
  }

 private:
  enum class Phase {
    kHandshake,  // TLS: before the first request
    kIdle,       // no request under way: the idle timeout runs
    kReading,    // a request begun: the read timeout runs (reset by each read)
    kAnswering,  // the request is read; its answer is being made or written
    kLingering,  // the last answer was written, the sending side shut: reading to drop
    kClosed,
  };

  // --- on the executor ---

  void Open() {
    {
      absl::MutexLock lock(&mu_);
      fd_ = stream_.lowest_layer().native_handle();
    }
    if constexpr (kTls) {
      phase_ = Phase::kHandshake;
      ArmReadTimer(options_.read_timeout);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (self->phase_ == Phase::kClosed) return;
                                if (ec) return self->Close();
                                self->StartIdle();
                              });
    } else {
      StartIdle();
    }
  }

  // Waits for the next request (parsing at once what was pipelined).
  void StartIdle() {
    phase_ = Phase::kIdle;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(
        std::min<size_t>(options_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser_->body_limit(options_.max_body_bytes);
    parser_->eager(true);
    header_seen_ = false;
    if (in_pos_ < in_.size()) {
      phase_ = Phase::kReading;
      ArmReadTimer(options_.read_timeout);
      Parse();
      return;
    }
    in_.clear();
    in_pos_ = 0;
    if (in_.capacity() > kBodyReadBytes) in_.shrink_to_fit();
    ArmReadTimer(options_.idle_timeout);
    if (reading_) return;
    if (chunk_.capacity() > kSmallReadBytes) std::vector<char>().swap(chunk_);  // a body's buffer
    Read();
  }

  // One read at a time, whatever the phase: it feeds the parser, notices a client that leaves
  // while its answer is made, and drops what comes after a closing answer.
  void Read() {
    reading_ = true;
    const bool body =
        (phase_ == Phase::kReading && header_seen_) || phase_ == Phase::kLingering;
    chunk_.resize(body ? kBodyReadBytes : kSmallReadBytes);
    stream_.async_read_some(asio::buffer(chunk_),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              self->OnRead(ec, n);
                            });
  }

  void OnRead(beast::error_code ec, size_t n) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    // End of stream, a reset, a TLS error: the client is gone (an answer under way is
    // abandoned: its on_gone runs).
    if (ec) return Close();
    switch (phase_) {
      case Phase::kLingering:
        lingered_ += n;
        if (lingered_ > kMaxLingerBytes) return Close();
        ArmReadTimer(options_.read_timeout);
        return Read();
      case Phase::kIdle:
        phase_ = Phase::kReading;
        [[fallthrough]];
      case Phase::kReading:
        in_.append(chunk_.data(), n);
        ArmReadTimer(options_.read_timeout);
        return Parse();
      case Phase::kAnswering:
        in_.append(chunk_.data(), n);
        return ReadWhileAnswering();
      default:
        return;
    }
  }

  void ReadWhileAnswering() {
    if (!reading_ && in_.size() - in_pos_ < kMaxPipelinedBytes) Read();
  }

  void Parse() {
    while (phase_ == Phase::kReading && in_pos_ < in_.size()) {
      beast::error_code ec;
      const size_t used =
          parser_->put(asio::buffer(in_.data() + in_pos_, in_.size() - in_pos_), ec);
      in_pos_ += used;
      if (ec && ec != http::error::need_more) return Refuse(ec);
      if (!header_seen_ && parser_->is_header_done()) {
        header_seen_ = true;
        OnHeader();
      }
      if (parser_->is_done()) return Dispatch();
      if (ec == http::error::need_more || used == 0) break;
    }
    CompactInput();
    if (!reading_) Read();
  }

  void CompactInput() {
    if (in_pos_ == 0) return;
    in_.erase(0, in_pos_);
    in_pos_ = 0;
  }

  void OnHeader() {
    // A client that waits for leave to send its body (curl does beyond 1 MiB) gets it now; a
    // body over the limit was refused by the parser already.
    if (!parser_->is_done() &&
        absl::EqualsIgnoreCase(Str(parser_->get()[http::field::expect]), "100-continue")) {
      absl::MutexLock lock(&mu_);
      QueueLocked(kContinue, /*last=*/false);
    }
  }

  // A request that cannot be read: answered and the connection closed.
  void Refuse(beast::error_code ec) {
    int status = 400;
    std::string message = absl::StrCat("malformed HTTP request (", ec.message(), ")");
    if (ec == http::error::body_limit) {
      status = 413;
      message = absl::StrCat("the body is larger than ", options_.max_body_bytes, " bytes");
    } else if (ec == http::error::header_limit) {
      status = 431;
      message = absl::StrCat("the request's headers are larger than ", options_.max_header_bytes,
                             " bytes");
    }
    parser_.reset();
    shape_ = AnswerShape{};
    BeginAnswer();
    AnswerAtOnce(options_.error_page(status, message), /*close=*/true);
  }

  void Dispatch() {
    CompactInput();
    shape_.http10 = parser_->get().version() < 11;
    shape_.keep_alive = parser_->get().keep_alive();
    shape_.head_only = parser_->get().method() == http::verb::head;
    HttpRequest request = ToRequest(parser_->release());
    parser_.reset();
    const uint64_t answer = BeginAnswer();
    HttpDispatch dispatch;
    try {
      dispatch = serving_->dispatcher(request);
    } catch (...) {
      dispatch = HttpDispatch::Answer(options_.error_page(500, "internal error"));
    }
    if (dispatch.answer.has_value()) {
      AnswerAtOnce(*dispatch.answer, /*close=*/false);
    } else if (!dispatch.handler) {
      AnswerAtOnce(options_.error_page(500, "no handler"), /*close=*/false);
    } else {
      auto responder = std::make_shared<ConnectionResponder>(this->shared_from_this(), answer,
                                                             shape_, options_.error_page);
      TaskPool& pool = dispatch.long_running ? serving_->long_pool : serving_->short_pool;
      const bool queued = pool.TrySubmit(
          [responder, handler = std::move(dispatch.handler), request = std::move(request)] {
            responder->Run(handler, request);
          });
      if (!queued) {
        HttpResponse busy = options_.error_page(
            503, "the server is busy (every handler thread taken, the queue full); retry later");
        const bool hinted = std::any_of(busy.headers.begin(), busy.headers.end(),
                                        [](const auto& h) {
                                          return absl::EqualsIgnoreCase(h.first, "Retry-After");
                                        });
        if (!hinted) busy.headers.emplace_back("Retry-After", "1");
        AnswerAtOnce(busy, /*close=*/false);
      }
    }
    if (phase_ == Phase::kAnswering) ReadWhileAnswering();
  }

  // Opens the answer to the request just read; its id for responders.
  uint64_t BeginAnswer() {
    phase_ = Phase::kAnswering;
    CancelReadTimer();
    absl::MutexLock lock(&mu_);
    open_answer_ = ++answers_;
    last_queued_ = false;
    close_after_ = false;
    return open_answer_;
  }

  void AnswerAtOnce(const HttpResponse& response, bool close) {
    uint64_t answer;
    {
      absl::MutexLock lock(&mu_);
      answer = open_answer_;
    }
    const bool closing = close || !shape_.keep_alive;
    Enqueue(answer, WholeAnswer(response, shape_, closing), /*last=*/true, closing,
            /*wait=*/false);
  }

  // Queues bytes for the I/O thread to write. Plain TCP first tries to send them at once from
  // the calling thread (a handler's, usually): when nothing is queued or being written, a
  // non-blocking send of the whole piece saves the hop to the I/O thread per SSE event. It uses
  // the descriptor under mu_, which Close() takes before closing it, so the descriptor cannot be
  // closed (and reused) underneath. What does not fit waits for the I/O thread; the end of an
  // answer always goes through it (it moves the connection to the next request).
  void QueueLocked(absl::string_view bytes, bool last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if constexpr (!kTls) {
      if (!flush_scheduled_ && pending_.empty() && fd_ >= 0) bytes.remove_prefix(SendNow(bytes));
    }
    if (gone_) return;
    pending_.append(bytes.data(), bytes.size());
    if (!flush_scheduled_ && (!pending_.empty() || last)) {
      flush_scheduled_ = true;
      asio::post(executor_, [self = this->shared_from_this()] { self->Flush(); });
    }
  }

  // Sends what the socket takes now; the bytes sent. A failed send (the client reset or closed)
  // marks the client gone and has the I/O thread close the connection.
  size_t SendNow(absl::string_view bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        MarkGoneLocked();
        asio::post(executor_, [self = this->shared_from_this()] { self->Close(); });
        break;
      }
    }
    return sent;
  }

  // Writes what is queued, one batch at a time (what responders queue meanwhile goes out in
  // the next batch).
  void Flush() {
    if (phase_ == Phase::kClosed) return;
    bool answer_written = false;
    {
      absl::MutexLock lock(&mu_);
      if (pending_.empty()) {
        flush_scheduled_ = false;
        answer_written = last_queued_ && open_answer_ != 0;
      } else {
        writing_.swap(pending_);
        pending_.clear();
        in_flight_ = writing_.size();
      }
    }
    if (answer_written) return AnswerWritten();
    if (writing_.empty()) return;
    ArmWriteTimer();
    asio::async_write(stream_, asio::buffer(writing_),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        self->OnWritten(ec);
                      });
  }

  void OnWritten(beast::error_code ec) {
    ++write_timer_gen_;
    write_timer_.cancel();
    if (phase_ == Phase::kClosed) return;
    if (ec) return Close();
    writing_.clear();
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = 0;
    }
    Flush();
  }

  // The open answer's last byte is written: the next request, or the end.
  void AnswerWritten() {
    bool close;
    std::function<void()> drop;
    {
      absl::MutexLock lock(&mu_);
      close = close_after_;
      open_answer_ = 0;
      last_queued_ = false;
      drop.swap(on_gone_);
    }
    if (close) return Linger();
    StartIdle();
  }

  // Shuts the sending side (the client reads the answer, then the end) and drops what the
  // client still sends, until it closes, the read timeout, or kMaxLingerBytes.
  void Linger() {
    phase_ = Phase::kLingering;
    in_.clear();
    in_pos_ = 0;
    lingered_ = 0;
    beast::error_code ignored;
    stream_.lowest_layer().shutdown(tcp::socket::shutdown_send, ignored);
    ArmReadTimer(options_.read_timeout);
    if (!reading_) Read();
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    CancelReadTimer();
    ++write_timer_gen_;
    write_timer_.cancel();
    {
      absl::MutexLock lock(&mu_);
      MarkGoneLocked();
      fd_ = -1;
      beast::error_code ignored;
      stream_.lowest_layer().close(ignored);
    }
    serving_->Closed(this);
  }

  void ArmReadTimer(absl::Duration after) {
    const uint64_t gen = ++read_timer_gen_;
    read_timer_.expires_after(ToChrono(after));
    read_timer_.async_wait([self = this->shared_from_this(), gen](beast::error_code ec) {
      if (!ec && gen == self->read_timer_gen_) self->Close();
    });
  }

  void CancelReadTimer() {
    ++read_timer_gen_;
    read_timer_.cancel();
  }

  void ArmWriteTimer() {
    const uint64_t gen = ++write_timer_gen_;
    write_timer_.expires_after(ToChrono(options_.write_timeout));
    write_timer_.async_wait([self = this->shared_from_this(), gen](beast::error_code ec) {
      if (!ec && gen == self->write_timer_gen_) self->Close();
    });
  }

  // --- shared ---

  void MarkGoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (gone_) return;
    gone_ = true;
    if (on_gone_) on_gone_();
    on_gone_ = nullptr;
  }

  const std::shared_ptr<HttpServing> serving_;
  const HttpServerOptions& options_;
  Stream stream_;
  typename Stream::executor_type executor_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;

  // On the executor.
  Phase phase_ = Phase::kIdle;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool header_seen_ = false;
  AnswerShape shape_;
  bool reading_ = false;
  std::vector<char> chunk_;  // the read in flight writes here
  std::string in_;           // bytes read and not parsed yet, from in_pos_
  size_t in_pos_ = 0;
  size_t lingered_ = 0;
  std::string writing_;  // the write in flight
  uint64_t read_timer_gen_ = 0;
  uint64_t write_timer_gen_ = 0;
  uint64_t answers_ = 0;

  // Shared with responders.
  absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // queued, not yet handed to a write
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool flush_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t open_answer_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none
  bool last_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool close_after_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_gone_ ABSL_GUARDED_BY(mu_);
  int fd_ ABSL_GUARDED_BY(mu_) = -1;  // the socket's descriptor while open (plain TCP's SendNow)
};

}  // namespace

HttpServing::HttpServing(const HttpServerOptions& options, const HttpDispatcher& dispatcher)
    : options(options),
      dispatcher(dispatcher),
      long_pool(options.long_handler_threads, /*max_queued=*/SIZE_MAX),
      short_pool(options.short_handler_threads, options.short_handler_queue) {}

void HttpServing::Opened(HttpConnection* connection, std::weak_ptr<HttpConnection> handle) {
  absl::MutexLock lock(&mu_);
  open_[connection] = std::move(handle);
}

void HttpServing::Closed(HttpConnection* connection) {
  absl::MutexLock lock(&mu_);
  open_.erase(connection);
}

void HttpServing::AbortAll() {
  std::vector<std::shared_ptr<HttpConnection>> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [connection, handle] : open_) {
      if (std::shared_ptr<HttpConnection> alive = handle.lock()) open.push_back(std::move(alive));
    }
  }
  for (const std::shared_ptr<HttpConnection>& connection : open) connection->Abort();
}

int HttpServing::open_connections() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

void ServePlainConnection(std::shared_ptr<HttpServing> serving, tcp::socket socket) {
  std::make_shared<StreamConnection<tcp::socket>>(std::move(serving), std::move(socket))->Begin();
}

void ServeTlsConnection(std::shared_ptr<HttpServing> serving, tcp::socket socket,
                        asio::ssl::context& tls) {
  using TlsStream = asio::ssl::stream<tcp::socket>;
  std::make_shared<StreamConnection<TlsStream>>(std::move(serving), std::move(socket), tls)
      ->Begin();
}

}  // namespace estuary::rpc
