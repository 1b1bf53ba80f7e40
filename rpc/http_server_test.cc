// rpc/http_server.h over loopback: answers at once and on the pools, keep-alive and pipelining,
// chunked streams, the limits (413, 431, 400, a full short pool's 503), the deadlines (idle,
// read, write), a client that leaves (its handler's on_gone runs at once), HEAD and
// Expect: 100-continue. Raw sockets where a client library would hide the bytes.
#include "rpc/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace estuary::rpc {
namespace {

// A loopback TCP client that says exactly what it is told.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) { (void)!write(fd_, bytes.data(), bytes.size()); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Reads until `until` is in what was read, the peer closes, or `wait` passes.
  std::string ReadUntil(const std::string& until, absl::Duration wait = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + wait;
    while (!absl::StrContains(read_, until) && absl::Now() < deadline) {
      if (!ReadSome(deadline)) break;
    }
    return read_;
  }
  // True when the server closed the connection within `wait`.
  bool ClosedWithin(absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    while (absl::Now() < deadline) {
      if (!ReadSome(deadline)) return eof_;
    }
    return false;
  }

 private:
  bool ReadSome(absl::Time deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0 || poll(&p, 1, ms) <= 0) return false;
    char buffer[4096];
    const ssize_t n = read(fd_, buffer, sizeof(buffer));
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    read_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string read_;
};

HttpResponse Text(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

// A server whose routes the tests set: GET /now answers on the I/O thread, POST /echo on the
// short pool, anything else runs `long_handler` on the long pool.
struct TestServer {
  explicit TestServer(HttpServerOptions options = {}) {
    options.what = "test HTTP";
    server = std::make_unique<HttpServer>(options, [this](const HttpRequest& q) {
      if (q.path == "/now") return HttpDispatch::Answer(Text(200, "now:" + q.method));
      if (q.path == "/echo") {
        return HttpDispatch::Run(
            [](const HttpRequest& r, HttpResponder& out) {
              out.Send(Text(200, absl::StrCat(r.method, " ", r.target, " ", r.Header("x-tag"),
                                              " ", r.body)));
            },
            /*long_running=*/false);
      }
      return HttpDispatch::Run(long_handler, /*long_running=*/true);
    });
    EXPECT_TRUE(server->Start().ok());
  }
  HttpHandler long_handler = [](const HttpRequest&, HttpResponder&) {};
  std::unique_ptr<HttpServer> server;
};

TEST(HttpServerTest, AnswersAtOnceAndOnThePoolsOverOneKeptAliveConnection) {
  TestServer test;
  httplib::Client client("127.0.0.1", test.server->port());
  client.set_keep_alive(true);
  auto now = client.Get("/now");
  ASSERT_TRUE(now);
  EXPECT_EQ(now->status, 200);
  EXPECT_EQ(now->body, "now:GET");
  EXPECT_EQ(now->get_header_value("Content-Type"), "text/plain");
  for (int i = 0; i < 3; ++i) {
    auto echo = client.Post("/echo?q=1", {{"X-Tag", "t"}}, "body" + std::to_string(i),
                            "text/plain");
    ASSERT_TRUE(echo);
    EXPECT_EQ(echo->body, absl::StrCat("POST /echo?q=1 t body", i));
  }
  EXPECT_EQ(test.server->open_connections(), 1);
}

TEST(HttpServerTest, AStreamIsChunkedAndAHandlerThatAnswersNothingGets500) {
  TestServer test;
  test.long_handler = [](const HttpRequest& q, HttpResponder& r) {
    if (q.path == "/nothing") return;
    if (q.path == "/throws") throw std::runtime_error("boom");
    ASSERT_TRUE(r.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.Write(absl::StrCat("data: ", i, "\n\n")));
    EXPECT_TRUE(r.Finish());
    EXPECT_FALSE(r.Write("late"));
  };
  RawClient raw(test.server->port());
  raw.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string got = raw.ReadUntil("0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200 OK\r\n")) << got;
  EXPECT_TRUE(absl::StrContains(got, "Transfer-Encoding: chunked\r\n")) << got;
  EXPECT_TRUE(absl::StrContains(got, "Cache-Control: no-cache\r\n")) << got;
  EXPECT_TRUE(absl::StrContains(got, "\r\n\r\n9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n")) << got;
  EXPECT_TRUE(absl::EndsWith(got, "0\r\n\r\n")) << got;

  httplib::Client client("127.0.0.1", test.server->port());
  auto nothing = client.Get("/nothing");
  ASSERT_TRUE(nothing);
  EXPECT_EQ(nothing->status, 500);
  auto threw = client.Get("/throws");
  ASSERT_TRUE(threw);
  EXPECT_EQ(threw->status, 500);
}

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInTurnAndHeadHasNoBody) {
  TestServer test;
  RawClient raw(test.server->port());
  raw.Send("GET /now HTTP/1.1\r\nHost: x\r\n\r\nHEAD /now HTTP/1.1\r\nHost: x\r\n\r\n"
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
  const std::string got = raw.ReadUntil("POST /echo  hi");
  EXPECT_TRUE(absl::StrContains(
      got, "Content-Length: 7\r\n\r\nnow:GETHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
           "Content-Length: 7\r\n\r\nHTTP/1.1 200 OK"))
      << got;
  EXPECT_TRUE(absl::EndsWith(got, "POST /echo  hi")) << got;
}

TEST(HttpServerTest, LimitsAreRefusedAndMalformedRequestsGet400) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  options.max_header_bytes = 2048;
  TestServer test(options);
  httplib::Client client("127.0.0.1", test.server->port());
  auto big = client.Post("/echo", std::string(64 << 10, 'a'), "text/plain");
  ASSERT_TRUE(big) << httplib::to_string(big.error());
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(big->body, "the body is larger than 1024 bytes\n");
  auto fits = client.Post("/echo", std::string(1024, 'a'), "text/plain");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200);

  RawClient headers(test.server->port());
  headers.Send(absl::StrCat("GET /now HTTP/1.1\r\nX-Big: ", std::string(4096, 'b'), "\r\n\r\n"));
  EXPECT_TRUE(absl::StartsWith(headers.ReadUntil("\r\n\r\n"), "HTTP/1.1 431 ")) << headers.ReadUntil("");
  RawClient garbage(test.server->port());
  garbage.Send("NOT HTTP AT ALL\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(garbage.ReadUntil("\r\n\r\n"), "HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_TRUE(garbage.ClosedWithin(absl::Seconds(5)));
}

TEST(HttpServerTest, ExpectContinueGetsItsInterimAnswer) {
  TestServer test;
  RawClient raw(test.server->port());
  raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(raw.ReadUntil("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  raw.Send("abc");
  EXPECT_TRUE(absl::EndsWith(raw.ReadUntil("POST /echo  abc"), "POST /echo  abc"));
}

// Idle connections hold no thread: hundreds of them neither delay a request nor outlive the
// idle timeout; a request begun and not finished is dropped at the read timeout.
TEST(HttpServerTest, IdleAndSlowConnectionsAreClosedAtTheirDeadlines) {
  HttpServerOptions options;
  options.idle_timeout = absl::Milliseconds(300);
  options.read_timeout = absl::Milliseconds(600);
  TestServer test(options);
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<RawClient>(test.server->port()));
  RawClient slow(test.server->port());
  slow.Send("GET /now HTTP/1.1\r\n");
  const absl::Time start = absl::Now();
  httplib::Client client("127.0.0.1", test.server->port());
  auto now = client.Get("/now");
  ASSERT_TRUE(now);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(250));
  int closed = 0;
  for (auto& c : idle) closed += c->ClosedWithin(absl::Seconds(5)) ? 1 : 0;
  EXPECT_EQ(closed, 300);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(550));
}

// A client that leaves while its handler runs: on_gone runs at once, and writes fail.
TEST(HttpServerTest, AClientThatLeavesIsNoticedAtOnce) {
  TestServer test;
  absl::Notification started, gone, finished;
  std::atomic<bool> write_failed{false};
  test.long_handler = [&](const HttpRequest&, HttpResponder& r) {
    r.OnClientGone([&] { gone.Notify(); });
    started.Notify();
    gone.WaitForNotificationWithTimeout(absl::Seconds(10));
    write_failed = !r.Send(Text(200, "too late"));
    r.OnClientGone(nullptr);
    finished.Notify();
  };
  RawClient raw(test.server->port());
  raw.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time left = absl::Now();
  raw.Close();
  ASSERT_TRUE(gone.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - left, absl::Milliseconds(500));
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(write_failed.load());
}

// A client that reads nothing of a stream: Write blocks while the connection holds its share,
// then fails at the write timeout.
TEST(HttpServerTest, AClientThatReadsNothingIsDroppedAtTheWriteTimeout) {
  HttpServerOptions options;
  options.write_timeout = absl::Milliseconds(300);
  TestServer test(options);
  absl::Notification done;
  std::atomic<int64_t> written{0};
  test.long_handler = [&](const HttpRequest&, HttpResponder& r) {
    const std::string piece(64 << 10, 'x');
    if (r.StartStream(200, "text/plain", {})) {
      while (written < (int64_t{1} << 30) && r.Write(piece)) written += piece.size();
    }
    done.Notify();
  };
  RawClient raw(test.server->port());
  raw.Send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_LT(written.load(), int64_t{256} << 20) << "the writer was never held back";
}

// Beyond the short pool's threads and queue: 503 with Retry-After, at once.
TEST(HttpServerTest, AFullShortPoolAnswers503) {
  HttpServerOptions options;
  options.short_handler_threads = 1;
  options.short_handler_queue = 0;
  absl::Notification release;
  std::atomic<int> entered{0};
  options.what = "busy";
  HttpServer server(options, [&](const HttpRequest&) {
    return HttpDispatch::Run(
        [&](const HttpRequest&, HttpResponder& r) {
          ++entered;
          release.WaitForNotificationWithTimeout(absl::Seconds(10));
          r.Send(Text(200, "done"));
        },
        /*long_running=*/false);
  });
  ASSERT_TRUE(server.Start().ok());
  std::thread first([&] {
    httplib::Client client("127.0.0.1", server.port());
    auto r = client.Get("/a");
    EXPECT_TRUE(r && r->status == 200);
  });
  while (entered.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  httplib::Client client("127.0.0.1", server.port());
  auto busy = client.Get("/b");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  release.Notify();
  first.join();
}

TEST(HttpServerTest, StopEndsOpenConnectionsAndRunningHandlers) {
  TestServer test;
  absl::Notification started;
  std::atomic<bool> saw_gone{false};
  test.long_handler = [&](const HttpRequest&, HttpResponder& r) {
    started.Notify();
    while (!r.client_gone()) absl::SleepFor(absl::Milliseconds(5));
    saw_gone = true;
  };
  RawClient raw(test.server->port());
  raw.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  test.server->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(saw_gone.load());
  EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(1)));
  EXPECT_FALSE(httplib::Client("127.0.0.1", test.server->port()).Get("/now"));
}

// Connections the server closed first linger in TIME_WAIT on its port; a server started again
// right away still binds it (SO_REUSEADDR), as a restarted router must.
TEST(HttpServerTest, ARestartedServerBindsItsPortAgain) {
  int port = 0;
  {
    TestServer first;
    port = first.server->port();
    for (int i = 0; i < 3; ++i) {
      RawClient raw(port);
      raw.Send("GET /now HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(5)));
    }
  }
  HttpServerOptions options;
  options.port = port;
  TestServer again(options);
  EXPECT_EQ(again.server->port(), port);
}

TEST(HttpServerTest, APortInUseIsUnavailable) {
  TestServer test;
  HttpServerOptions options;
  options.port = test.server->port();
  options.what = "second";
  HttpServer second(options, [](const HttpRequest&) { return HttpDispatch::Answer(Text(200, "")); });
  const absl::Status started = second.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  EXPECT_TRUE(absl::StrContains(started.message(), "second: cannot listen on")) << started;
}

}  // namespace
}  // namespace estuary::rpc
