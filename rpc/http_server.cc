#include "rpc/http_server.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl/context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "core/common/logging.h"
#include "rpc/http_connection.h"

namespace estuary::rpc {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Connections waiting to be accepted (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 4096;
// An accept that fails for want of a descriptor (EMFILE) is tried again after this, not in a
// busy loop.
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);
// Stop() waits this long for the closed connections' last operations.
constexpr absl::Duration kStopGrace = absl::Seconds(2);

}  // namespace

// Declared in the order they must be destroyed last-first: the I/O context (and with it every
// connection still queued on it) goes before the TLS context and the reloader its handshakes
// call.
struct HttpServer::Impl {
  explicit Impl(int io_threads)
      : io(io_threads), acceptor(asio::make_strand(io)), retry(acceptor.get_executor()) {}

  void Accept() {
    acceptor.async_accept(asio::make_strand(io), [this](boost::system::error_code ec,
                                                        tcp::socket socket) {
      if (!acceptor.is_open() || ec == asio::error::operation_aborted) return;
      if (ec) {
        if (absl::Now() - last_accept_warning > absl::Seconds(10)) {
          ESTUARY_LOG(WARNING) << serving->options.what << ": accept failed (" << ec.message()
                               << "); retrying";
          last_accept_warning = absl::Now();
        }
        retry.expires_after(kAcceptRetry);
        retry.async_wait([this](boost::system::error_code wait) {
          if (!wait) Accept();
        });
        return;
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (tls != nullptr) {
        ServeTlsConnection(serving, std::move(socket), *tls);
      } else {
        ServePlainConnection(serving, std::move(socket));
      }
      Accept();
    });
  }

  std::unique_ptr<CertificateReloader> reloader;
  std::unique_ptr<asio::ssl::context> tls;
  std::shared_ptr<HttpServing> serving;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  absl::Time last_accept_warning = absl::InfinitePast();
  std::vector<std::thread> threads;
};

HttpServer::HttpServer(HttpServerOptions options, HttpDispatcher dispatcher)
    : options_(std::move(options)), dispatcher_(std::move(dispatcher)) {}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() {
  if (impl_ != nullptr) return absl::FailedPreconditionError(options_.what + " already started");
  auto impl = std::make_unique<Impl>(std::max(options_.io_threads, 1));
  if (options_.tls.enabled()) {
    absl::StatusOr<std::unique_ptr<CertificateReloader>> reloader =
        CertificateReloader::Create(options_.tls);
    if (!reloader.ok()) return reloader.status();
    impl->reloader = *std::move(reloader);
    impl->tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    impl->tls->set_options(asio::ssl::context::default_workarounds |
                           asio::ssl::context::no_compression);
    // An idle TLS connection keeps no read or write buffers.
    SSL_CTX_set_mode(impl->tls->native_handle(), SSL_MODE_RELEASE_BUFFERS);
    impl->reloader->InstallOn(impl->tls->native_handle());
  }
  impl->serving = std::make_shared<HttpServing>(options_, dispatcher_);

  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  const auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port),
                                          tcp::resolver::passive, ec);
  if (!ec && endpoints.empty()) ec = asio::error::host_not_found;
  if (!ec) {
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    impl->acceptor.open(endpoint.protocol(), ec);
    if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(endpoint, ec);
    if (!ec) impl->acceptor.listen(kListenBacklog, ec);
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(options_.what, ": cannot listen on ", options_.host,
                                               ":", options_.port, " (", ec.message(), ")"));
  }
  port_ = impl->acceptor.local_endpoint().port();
  address_ = absl::StrCat(options_.host, ":", port_);
  impl->work.emplace(asio::make_work_guard(impl->io));
  impl->Accept();
  for (int i = 0; i < std::max(options_.io_threads, 1); ++i) {
    impl->threads.emplace_back([io = &impl->io, what = options_.what] {
      for (;;) {
        try {
          io->run();
          return;
        } catch (const std::exception& e) {
          ESTUARY_LOG(ERROR) << what << ": an I/O handler threw: " << e.what();
        }
      }
    });
  }
  impl_ = std::move(impl);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (impl_ == nullptr) return;
  absl::Notification accepting_stopped;
  asio::post(impl_->acceptor.get_executor(), [this, &accepting_stopped] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->retry.cancel();
    accepting_stopped.Notify();
  });
  accepting_stopped.WaitForNotificationWithTimeout(kStopGrace);
  // Every client is gone for its handler from here (on_gone runs now), so the handlers return.
  impl_->serving->AbortAll();
  impl_->serving->long_pool.Stop();
  impl_->serving->short_pool.Stop();
  const absl::Time deadline = absl::Now() + kStopGrace;
  while (impl_->serving->open_connections() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  impl_->work.reset();
  impl_->io.stop();
  for (std::thread& thread : impl_->threads) thread.join();
  impl_.reset();
}

int HttpServer::open_connections() const {
  return impl_ == nullptr ? 0 : impl_->serving->open_connections();
}

}  // namespace estuary::rpc
