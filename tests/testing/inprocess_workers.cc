#include "tests/testing/inprocess_workers.h"

#include "absl/time/clock.h"
#include "core/model/model_loader.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess_transport.h"
#include "tests/testing/golden_cases.h"

namespace estuary::testing {
namespace {

std::unique_ptr<ShardedModel> Load(const std::string& model) {
  auto loaded = LoadModel(GoldenModelDir(model));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  auto sharded = ShardedModel::Create(std::move(loaded->model), ShardedModelOptions());
  EXPECT_TRUE(sharded.ok()) << sharded.status();
  return sharded.ok() ? std::move(*sharded) : nullptr;
}

}  // namespace

InProcessWorkers::InProcessWorkers(InProcessWorkersOptions options) : model_id_(options.model) {
  decode_model_ = Load(options.model);
  prefill_model_ = Load(options.model);
  decode_transport_ = kvtransfer::InProcessTransport::Create();
  prefill_transport_ = options.prefill_transport != nullptr
                           ? std::move(options.prefill_transport)
                           : kvtransfer::InProcessTransport::Create();
  DecodeServiceOptions decode_options;
  decode_options.model_id = model_id_;
  decode_options.engine.kv_cache_bytes = int64_t{8} << 20;
  decode_options.default_lease = options.lease;
  decode_options.engine.lease_grace = options.lease_grace;
  auto decode = DecodeService::Create(*decode_model_, *decode_transport_, decode_options);
  EXPECT_TRUE(decode.ok()) << decode.status();
  decode_ = std::move(*decode);
  PrefillServiceOptions prefill_options;
  prefill_options.model_id = model_id_;
  prefill_options.engine.kv_cache_bytes = int64_t{8} << 20;
  auto prefill = PrefillService::Create(*prefill_model_, *prefill_transport_, prefill_options);
  EXPECT_TRUE(prefill.ok()) << prefill.status();
  prefill_ = std::move(*prefill);
  // Ready at once: no ServeWorker watches these services (tests drive their state directly).
  decode_->control().ready = true;
  prefill_->control().ready = true;
  auto server = rpc::StartGrpcServer("127.0.0.1", 0, {decode_.get(), prefill_.get()});
  EXPECT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
}

InProcessWorkers::~InProcessWorkers() {
  if (server_.server != nullptr) {
    server_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }
}

int InProcessWorkers::DecodeFreePages() {
  const KvPoolStats stats = decode_->engine().pool().Stats();
  return stats.free_pages + stats.cached_pages;
}

}  // namespace estuary::testing
