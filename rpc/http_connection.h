#pragma once
// The connections of rpc/http_server.h (internal to it): what every connection of one server
// shares (HttpServing), and one connection as its responders and the server see it. The
// reading, parsing, writing and deadlines live in http_connection.cc, on Boost.Asio and Beast.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"
#include "rpc/http_exchange.h"
#include "rpc/http_server.h"
#include "rpc/task_pool.h"

namespace estuary::rpc {

class HttpConnection;

// Owned by the server and by each of its open connections (a connection may outlive Stop()
// by the time its last operation completes).
class HttpServing {
 public:
  HttpServing(const HttpServerOptions& options, const HttpDispatcher& dispatcher);

  const HttpServerOptions options;
  const HttpDispatcher dispatcher;
  TaskPool long_pool;
  TaskPool short_pool;

  // The open connections, so that Stop() can close them.
  void Opened(HttpConnection* connection, std::weak_ptr<HttpConnection> handle);
  void Closed(HttpConnection* connection);
  // Closes every open connection (their on_gone callbacks run before this returns).
  void AbortAll();
  int open_connections();

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<HttpConnection*, std::weak_ptr<HttpConnection>> open_ ABSL_GUARDED_BY(mu_);
};

// One connection, as its responders (on handler threads) and the server see it. An answer is
// the bytes of one request's response; `answer` ids tell a responder whose request was answered
// from one of the next request.
class HttpConnection {
 public:
  virtual ~HttpConnection() = default;

  // Queues `bytes` of answer `answer` for writing; `last` ends the answer (then the connection
  // reads the next request, or closes when `close_after`). With `wait`, blocks while more than
  // kMaxQueuedBytes wait to be written. False when the client is gone or `answer` is not the
  // one open.
  virtual bool Enqueue(uint64_t answer, std::string bytes, bool last, bool close_after,
                       bool wait) = 0;
  // The responder's on_gone (http_exchange.h) for answer `answer`.
  virtual void SetOnGone(uint64_t answer, std::function<void()> on_gone) = 0;
  virtual bool Gone() = 0;
  // Closes the connection from any thread: marks the client gone (on_gone runs now) and closes
  // the socket on the connection's own executor.
  virtual void Abort() = 0;

  static constexpr size_t kMaxQueuedBytes = size_t{256} << 10;
};

// Starts serving an accepted socket (plain, or TLS with `tls`'s context, which must outlive
// the connection).
void ServePlainConnection(std::shared_ptr<HttpServing> serving, boost::asio::ip::tcp::socket socket);
void ServeTlsConnection(std::shared_ptr<HttpServing> serving, boost::asio::ip::tcp::socket socket,
                        boost::asio::ssl::context& tls);

}  // namespace estuary::rpc
