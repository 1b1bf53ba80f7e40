#include "rpc/http_responder.h"

#include <exception>
#include <utility>

#include "core/common/logging.h"

namespace estuary::rpc {

ConnectionResponder::ConnectionResponder(std::shared_ptr<HttpConnection> connection,
                                         uint64_t answer, AnswerShape shape,
                                         HttpErrorPage error_page)
    : connection_(std::move(connection)),
      answer_(answer),
      shape_(shape),
      error_page_(std::move(error_page)) {}

bool ConnectionResponder::Queue(std::string bytes, bool last, bool close_after) {
  return connection_->Enqueue(answer_, std::move(bytes), last, close_after, /*wait=*/true);
}

bool ConnectionResponder::Send(HttpResponse response) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNone) return false;
  state_ = State::kDone;
  return Queue(WholeAnswer(response, shape_, /*close=*/false), /*last=*/true,
               /*close_after=*/!shape_.keep_alive);
}

bool ConnectionResponder::StartStream(int status, std::string content_type, HttpHeaders headers) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNone) return false;
  state_ = State::kStreaming;
  ResponseHeadSpec head;
  head.status = status;
  head.content_type = content_type;
  head.headers = &headers;
  // HTTP/1.0 has no chunked bodies: the stream ends with the connection.
  chunked_ = !shape_.http10;
  head.framing = chunked_ ? BodyFraming::kChunked : BodyFraming::kUntilClose;
  head.http10 = shape_.http10;
  head.keep_alive = chunked_ && shape_.keep_alive;
  return Queue(ResponseHead(head), /*last=*/false, /*close_after=*/false);
}

bool ConnectionResponder::Write(absl::string_view data) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kStreaming) return false;
  if (data.empty() || shape_.head_only) return !connection_->Gone();
  return Queue(chunked_ ? Chunk(data) : std::string(data), /*last=*/false, /*close_after=*/false);
}

bool ConnectionResponder::Finish() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kStreaming) return false;
  state_ = State::kDone;
  const bool body_ends = chunked_ && !shape_.head_only;
  return Queue(body_ends ? std::string(kLastChunk) : std::string(), /*last=*/true,
               /*close_after=*/!chunked_ || !shape_.keep_alive);
}

void ConnectionResponder::OnClientGone(std::function<void()> on_gone) {
  connection_->SetOnGone(answer_, std::move(on_gone));
}

bool ConnectionResponder::client_gone() const { return connection_->Gone(); }

void ConnectionResponder::Run(const HttpHandler& handler, const HttpRequest& request) {
  bool threw = false;
  try {
    handler(request, *this);
  } catch (const std::exception& e) {
    ESTUARY_LOG(ERROR) << "HTTP handler of " << request.method << " " << request.path
                       << " threw: " << e.what();
    threw = true;
  } catch (...) {
    ESTUARY_LOG(ERROR) << "HTTP handler of " << request.method << " " << request.path
                       << " threw";
    threw = true;
  }
  OnClientGone(nullptr);
  State state;
  {
    absl::MutexLock lock(&mu_);
    state = state_;
  }
  if (state == State::kNone) {
    Send(error_page_(500, threw ? "internal error" : "the handler wrote no answer"));
  } else if (state == State::kStreaming) {
    if (threw) {
      connection_->Abort();
    } else {
      Finish();
    }
  }
}

}  // namespace estuary::rpc
