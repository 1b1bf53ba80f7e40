#pragma once
// The bytes of an HTTP/1.x answer that rpc/http_server.h writes: the status line and headers,
// and the chunks of a streamed body. Pure functions (Boost.Beast parses requests; the answers
// are few and simple enough to write here, byte for byte as tests read them).

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "rpc/http_exchange.h"

namespace estuary::rpc {

// How the body after the head is delimited.
enum class BodyFraming {
  kLength,      // Content-Length: the body follows whole
  kChunked,     // Transfer-Encoding: chunked (HTTP/1.1 streams)
  kUntilClose,  // the connection's close ends it (HTTP/1.0 streams)
};

struct ResponseHeadSpec {
  int status = 200;
  absl::string_view content_type;
  const HttpHeaders* headers = nullptr;  // may be null
  BodyFraming framing = BodyFraming::kLength;
  size_t content_length = 0;  // kLength
  bool http10 = false;        // the request's version was 1.0: answer in 1.0
  bool keep_alive = true;     // false: "Connection: close"
};

// "HTTP/1.1 200 OK\r\n", Content-Type, the framing header, the extra headers, Connection when it
// is not the version's default, then the empty line. Header names or values with CR, LF or NUL
// are dropped (a handler cannot split the answer).
std::string ResponseHead(const ResponseHeadSpec& spec);

// How the request asked to be answered.
struct AnswerShape {
  bool http10 = false;      // HTTP/1.0: no chunked bodies, keep-alive only when asked
  bool keep_alive = true;   // the request allows the connection to stay open
  bool head_only = false;   // HEAD: the head as for GET, no body
};

// The bytes of a whole answer (head with Content-Length, then the body unless head_only).
// `close` forces "Connection: close".
std::string WholeAnswer(const HttpResponse& response, const AnswerShape& shape, bool close);

// One chunk of a chunked body: "<hex size>\r\n<data>\r\n"; "" for empty data (an empty chunk
// would end the body).
std::string Chunk(absl::string_view data);
inline constexpr absl::string_view kLastChunk = "0\r\n\r\n";

// "OK", "Not Found", ...; "Unknown" for a status without one.
absl::string_view ReasonPhrase(int status);

}  // namespace estuary::rpc
