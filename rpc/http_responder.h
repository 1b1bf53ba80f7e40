#pragma once
// The HttpResponder a handler of rpc/http_server.h gets (internal to it): one request's answer
// on its connection, framed as the request asked (rpc/http_wire.h), and what happens when a
// handler ends without answering or throws.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rpc/http_connection.h"
#include "rpc/http_exchange.h"
#include "rpc/http_wire.h"

namespace estuary::rpc {

class ConnectionResponder final : public HttpResponder {
 public:
  ConnectionResponder(std::shared_ptr<HttpConnection> connection, uint64_t answer,
                      AnswerShape shape, HttpErrorPage error_page);

  bool Send(HttpResponse response) override;
  bool StartStream(int status, std::string content_type, HttpHeaders headers) override;
  bool Write(absl::string_view data) override;
  bool Finish() override;
  void OnClientGone(std::function<void()> on_gone) override;
  bool client_gone() const override;

  // Runs `handler` and then ends the answer it left open: a 500 when it answered nothing (or
  // threw before answering), the end of a stream it left unfinished; a handler that threw while
  // streaming has its connection closed (the client sees the body cut short).
  void Run(const HttpHandler& handler, const HttpRequest& request);

 private:
  enum class State { kNone, kStreaming, kDone };
  bool Queue(std::string bytes, bool last, bool close_after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<HttpConnection> connection_;
  const uint64_t answer_;
  const AnswerShape shape_;
  const HttpErrorPage error_page_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNone;
  bool chunked_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace estuary::rpc
