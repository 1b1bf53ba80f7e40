#include "rpc/metadata_interceptor.h"

namespace estuary::rpc {
namespace {

class MetadataInterceptor final : public grpc::experimental::Interceptor {
 public:
  // The strings belong to the factory, which the channel keeps as long as its calls.
  MetadataInterceptor(const std::string& key, const std::string& value) : key_(key), value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({key_, value_});
    }
    methods->Proceed();
  }

 private:
  const std::string& key_;
  const std::string& value_;
};

class MetadataInterceptorFactoryImpl final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  MetadataInterceptorFactoryImpl(std::string key, std::string value)
      : key_(std::move(key)), value_(std::move(value)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new MetadataInterceptor(key_, value_);
  }

 private:
  const std::string key_;
  const std::string value_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MetadataInterceptorFactory(
    std::string key, std::string value) {
  return std::make_unique<MetadataInterceptorFactoryImpl>(std::move(key), std::move(value));
}

}  // namespace estuary::rpc
