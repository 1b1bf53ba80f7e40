#pragma once
// One HTTP exchange as the handlers see it, free of any HTTP library: the request read whole,
// a whole response, and the responder through which a handler answers (at once, or streamed in
// pieces), learns that its client went away, and ends. rpc/http_server.h serves these over
// Boost.Beast; the router's OpenAI door (router/openai) and the metrics port are written against
// this header only.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace estuary::rpc {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string target;  // as sent: the path and the query
  std::string path;    // the target up to '?'
  HttpHeaders headers;
  std::string body;

  // The first value of the header `name` (case-insensitive), or "".
  std::string Header(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain";
  HttpHeaders headers;  // besides Content-Type and the framing the server writes itself
  std::string body;
};

// The server's side of one request's answer, handed to its handler. Thread-safe; every call
// after the answer ended (Send, Finish, the client gone) does nothing and returns false.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;

  // The whole answer. False when the client is gone.
  virtual bool Send(HttpResponse response) = 0;

  // A streamed answer: the status and headers now, then the body in Write()s (sent as they come,
  // chunked), then Finish(). Write blocks while the client is far behind (the server holds a
  // bounded amount per connection) and fails once the client is gone: it closed or reset the
  // connection, read nothing for the write timeout, or the server stops.
  virtual bool StartStream(int status, std::string content_type, HttpHeaders headers) = 0;
  virtual bool Write(absl::string_view data) = 0;
  virtual bool Finish() = 0;

  // `on_gone` runs once, on a server thread, as soon as the client goes away before the answer
  // was written (at once when it is gone already). It runs under the responder's lock: it must
  // be quick and must not call back into the responder. nullptr clears it; after that call
  // returns, it never runs.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
  virtual bool client_gone() const = 0;
};

// Runs on the server's handler pool: answers `request` through `responder`. A handler that
// returns without answering gets a 500; one that started a stream has it finished.
using HttpHandler = std::function<void(const HttpRequest& request, HttpResponder& responder)>;

// What the server does with a request once it is read whole. Decided on an I/O thread, so the
// decision must not block: routing, credentials, admission.
struct HttpDispatch {
  // Answered at once, on the I/O thread (probes, refusals, errors).
  std::optional<HttpResponse> answer;
  // Else this runs on a pool thread: the long pool when `long_running` (up to
  // HttpServerOptions::long_handler_threads at once: the dispatcher admits no more than that),
  // else the short pool (a few threads; beyond its queue the server answers 503).
  HttpHandler handler;
  bool long_running = false;

  static HttpDispatch Answer(HttpResponse response) {
    HttpDispatch d;
    d.answer = std::move(response);
    return d;
  }
  static HttpDispatch Run(HttpHandler handler, bool long_running) {
    HttpDispatch d;
    d.handler = std::move(handler);
    d.long_running = long_running;
    return d;
  }
};

using HttpDispatcher = std::function<HttpDispatch(const HttpRequest& request)>;

// The body the server writes for the errors it finds itself (a malformed request 400, a body
// over the limit 413, headers over the limit 431, a full short pool 503, a handler that failed
// 500): `message` says which. The OpenAI door answers these in OpenAI's error shape.
using HttpErrorPage = std::function<HttpResponse(int status, const std::string& message)>;

// A plain-text error page ("message\n").
HttpResponse PlainErrorPage(int status, const std::string& message);

}  // namespace estuary::rpc
