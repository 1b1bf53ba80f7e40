#include "rpc/http_wire.h"

#include "gtest/gtest.h"

namespace estuary::rpc {
namespace {

TEST(HttpWireTest, HeadsSayTheFramingAndConnectionOnlyWhenNotTheDefault) {
  const HttpHeaders extra = {{"Retry-After", "1"}, {"Bad\r\nName", "x"}, {"X-Split", "a\r\nb"}};
  ResponseHeadSpec spec;
  spec.status = 429;
  spec.content_type = "application/json";
  spec.headers = &extra;
  spec.content_length = 12;
  EXPECT_EQ(ResponseHead(spec),
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            "Content-Length: 12\r\nRetry-After: 1\r\n\r\n");
  spec.framing = BodyFraming::kChunked;
  spec.keep_alive = false;
  EXPECT_EQ(ResponseHead(spec),
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nRetry-After: 1\r\nConnection: close\r\n\r\n");
  ResponseHeadSpec old;
  old.http10 = true;
  old.framing = BodyFraming::kUntilClose;
  EXPECT_EQ(ResponseHead(old), "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n");
}

TEST(HttpWireTest, ChunksAndWholeAnswers) {
  EXPECT_EQ(Chunk("hello, world, and more"), "16\r\nhello, world, and more\r\n");
  EXPECT_EQ(Chunk(""), "");
  HttpResponse response;
  response.status = 404;
  response.body = "none";
  EXPECT_EQ(WholeAnswer(response, AnswerShape{}, /*close=*/false),
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nnone");
  AnswerShape head;
  head.head_only = true;
  EXPECT_EQ(WholeAnswer(response, head, /*close=*/true),
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n"
            "Connection: close\r\n\r\n");
  EXPECT_EQ(ReasonPhrase(599), "Unknown");
}

}  // namespace
}  // namespace estuary::rpc
