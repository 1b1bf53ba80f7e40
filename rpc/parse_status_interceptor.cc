#include "rpc/parse_status_interceptor.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace estuary::rpc {
namespace {

using grpc::experimental::InterceptionHookPoints;

class ParseStatusInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseStatusInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : "?") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !methods->GetSendStatus().ok()) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request message of ", method_,
                       " did not parse (malformed protobuf)")));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* ParseStatusInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new ParseStatusInterceptor(info);
}

}  // namespace estuary::rpc
