#include "rpc/http_wire.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace estuary::rpc {
namespace {

bool SafeInHead(absl::string_view text) {
  return text.find_first_of(absl::string_view("\r\n\0", 3)) == absl::string_view::npos;
}

}  // namespace

std::string ResponseHead(const ResponseHeadSpec& spec) {
  std::string head = absl::StrCat(spec.http10 ? "HTTP/1.0 " : "HTTP/1.1 ", spec.status, " ",
                                  ReasonPhrase(spec.status), "\r\n");
  if (!spec.content_type.empty() && SafeInHead(spec.content_type)) {
    absl::StrAppend(&head, "Content-Type: ", spec.content_type, "\r\n");
  }
  switch (spec.framing) {
    case BodyFraming::kLength:
      absl::StrAppend(&head, "Content-Length: ", spec.content_length, "\r\n");
      break;
    case BodyFraming::kChunked:
      head += "Transfer-Encoding: chunked\r\n";
      break;
    case BodyFraming::kUntilClose:
      break;
  }
  if (spec.headers != nullptr) {
    for (const auto& [name, value] : *spec.headers) {
      if (name.empty() || !SafeInHead(name) || !SafeInHead(value)) continue;
      absl::StrAppend(&head, name, ": ", value, "\r\n");
    }
  }
  // HTTP/1.1 keeps a connection open unless told; HTTP/1.0 closes it unless told.
  if (!spec.keep_alive) {
    head += "Connection: close\r\n";
  } else if (spec.http10) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

std::string WholeAnswer(const HttpResponse& response, const AnswerShape& shape, bool close) {
  ResponseHeadSpec head;
  head.status = response.status;
  head.content_type = response.content_type;
  head.headers = &response.headers;
  head.framing = BodyFraming::kLength;
  head.content_length = response.body.size();
  head.http10 = shape.http10;
  head.keep_alive = shape.keep_alive && !close;
  std::string bytes = ResponseHead(head);
  if (!shape.head_only) bytes += response.body;
  return bytes;
}

std::string Chunk(absl::string_view data) {
  if (data.empty()) return "";
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

absl::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace estuary::rpc
