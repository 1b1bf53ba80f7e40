#pragma once
// HttpServer: an event-driven HTTP/1.1 server (Boost.Beast's parser on Boost.Asio), the
// transport of the router's OpenAI door and of every process's metrics port. Handlers see only
// rpc/http_exchange.h.
//
// Threads: `io_threads` run every connection's reads, writes, TLS and timers; an open connection
// holds no thread, only its socket, a small read buffer and its timers, so thousands of idle or
// slow clients cost memory, not threads. A request is read whole (headers and body, within
// `max_header_bytes` / `max_body_bytes`: 431 / 413 otherwise), then the dispatcher decides on the
// I/O thread: answer at once (probes, refusals), or run a handler on a pool (HttpDispatch).
//
// Deadlines (each closes the connection when it passes):
//   idle_timeout   no request under way (keep-alive between requests, and before the first)
//   read_timeout   a request (or the TLS handshake) begun and no byte of it for this long
//   write_timeout  answer bytes waiting and none taken by the client for this long
// While a handler runs, the connection keeps reading: a client that closes or resets is noticed
// at once and the responder's on_gone runs (the OpenAI door cancels the generation with it). A
// client that half-closes after its request (shutdown of its sending side) therefore counts as
// gone; HTTP clients do not do that. Pipelined requests are kept (up to 64 KiB) and answered in
// turn.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rpc/certificate_reloader.h"
#include "rpc/http_exchange.h"

namespace estuary::rpc {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;             // 0: any free port
  std::string what = "HTTP";  // names the server in errors and logs
  HttpsFiles tls;           // HTTPS with rotating certificates when set; plain HTTP otherwise
  size_t max_body_bytes = size_t{4} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  int io_threads = 2;
  // Pools (rpc/task_pool.h): long-running handlers (the dispatcher admits at most this many, so
  // none waits), and short ones (a queue of `short_handler_queue` beyond the threads, then 503).
  int long_handler_threads = 16;
  int short_handler_threads = 8;
  size_t short_handler_queue = 1024;
  HttpErrorPage error_page = PlainErrorPage;
};

class HttpServer {
 public:
  // `dispatcher` (and whatever it reaches) must outlive Stop().
  HttpServer(HttpServerOptions options, HttpDispatcher dispatcher);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves. UNAVAILABLE naming `what` when the address cannot be bound,
  // INVALID_ARGUMENT when the TLS files do not load, FAILED_PRECONDITION when started already.
  absl::Status Start();
  // Stops accepting, closes every connection (their handlers see their clients gone), waits for
  // the handlers to return and the I/O threads to end. Idempotent.
  void Stop();

  int port() const { return port_; }                       // the bound port, after Start
  const std::string& address() const { return address_; }  // host:port
  int open_connections() const;

 private:
  struct Impl;
  HttpServerOptions options_;
  HttpDispatcher dispatcher_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string address_;
};

}  // namespace estuary::rpc
