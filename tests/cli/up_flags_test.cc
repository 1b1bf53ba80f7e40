// `estuary up` with server flags and an API key, observed from outside as a user would:
//   - flags up is given for its processes reach them (--max-num-seqs, --max-model-len,
//     --kv-cache-memory in the workers' start line; --metrics-port in every member's log;
//     --served-model-name, --max-model-len, --http-port, --api-key at the router);
//   - the router's gRPC port answers UNAUTHENTICATED without `authorization: Bearer KEY` and
//     serves with it; its HTTP port answers 401 in OpenAI's error shape without the header,
//     keeps /health and /metrics open, and serves with it;
//   - --max-model-len is enforced (INVALID_ARGUMENT / HTTP 400 naming the limit);
//   - `estuary client --api-key` gets an answer, and without the key a refusal;
//   - --cluster-token reaches every process: the workers' ports refuse a call without it.
// One cluster of the in-repository stories260K (loads in milliseconds) for the whole file.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {
namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;

constexpr char kModel[] = "models/stories260K";
constexpr char kKey[] = "sk-test-0123456789";
constexpr char kClusterToken[] = "up-flags-cluster-token-0123";
constexpr char kServedName[] = "tiny-stories";
constexpr int kMaxModelLen = 64;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class UpFlagsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    log_dir_ = new std::string(testing::TempPath("up-flags-logs"));
    fs::remove_all(*log_dir_);
    const std::string ready = testing::TempPath("up-flags.ready");
    fs::remove(ready);
    http_port_ = testing::FreePort();
    absl::StatusOr<std::unique_ptr<ChildProcess>> up = ChildProcess::Start(
        {BinaryPath("cli/estuary"), "up", "--model", kModel, "--port", "0", "--prefill", "1",
         "--decode", "1", "--ready-file", ready, "--log-dir", *log_dir_, "--shutdown-timeout",
         "2s", "--api-key", kKey, "--served-model-name", kServedName, "--max-model-len",
         std::to_string(kMaxModelLen), "--max-num-seqs", "8", "--kv-cache-memory", "4MiB",
         "--metrics-port", "0", "--http-port", std::to_string(http_port_), "--cluster-token",
         kClusterToken},
        testing::TempPath("up-flags.log"));
    ASSERT_TRUE(up.ok()) << up.status();
    up_ = up->release();
    absl::StatusOr<std::string> address = WaitForReadyFile(ready, *up_, absl::Seconds(120));
    ASSERT_TRUE(address.ok()) << address.status() << "\n" << up_->Log();
    router_ = new std::string(*address);
  }

  static void TearDownTestSuite() {
    if (up_ != nullptr) {
      up_->Signal(SIGTERM);
      absl::StatusOr<int> exited = up_->Wait(absl::Seconds(30));
      EXPECT_TRUE(exited.ok() && *exited == 0) << up_->Log();
      delete up_;
      up_ = nullptr;
    }
    delete router_;
    delete log_dir_;
  }

  void SetUp() override {
    if (router_ == nullptr) GTEST_SKIP() << "the cluster did not start";
    stub_ = estuary::v1::Inference::NewStub(
        grpc::CreateChannel(*router_, grpc::InsecureChannelCredentials()));
  }

  static std::string Log(const std::string& member) {
    return ReadFile(fs::path(*log_dir_) / (member + ".log"));
  }

  static grpc::ClientContext* Context(grpc::ClientContext& context, const std::string& key) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!key.empty()) context.AddMetadata("authorization", "Bearer " + key);
    return &context;
  }

  // One Generate to the end; the status, and the tokens streamed.
  grpc::Status Generate(const std::string& key, int max_tokens, const std::string& model,
                        int* tokens) {
    estuary::v1::GenerateRequest request;
    request.set_text("Once upon a time");
    request.set_model(model);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_sampling()->set_temperature(0);
    grpc::ClientContext context;
    auto reader = stub_->Generate(Context(context, key), request);
    estuary::v1::GenerateResponse response;
    *tokens = 0;
    while (reader->Read(&response)) {
      if (response.has_chunk()) *tokens += response.chunk().token_ids_size();
    }
    return reader->Finish();
  }

  static ChildProcess* up_;
  static std::string* router_;
  static std::string* log_dir_;
  static int http_port_;
  std::unique_ptr<estuary::v1::Inference::Stub> stub_;
};

ChildProcess* UpFlagsTest::up_ = nullptr;
std::string* UpFlagsTest::router_ = nullptr;
std::string* UpFlagsTest::log_dir_ = nullptr;
int UpFlagsTest::http_port_ = 0;

TEST_F(UpFlagsTest, WorkerFlagsReachTheWorkers) {
  for (const char* member : {"decode0", "prefill0"}) {
    const std::string log = Log(member);
    SCOPED_TRACE(member);
    // "<role> KV cache: 4MiB = P pages of 16 tokens = T KV tokens; max-model-len 64 ->
    //  concurrency C sequences at full length (max-num-seqs 8)"
    std::smatch match;
    ASSERT_TRUE(std::regex_search(
        log, match,
        std::regex("KV cache: 4MiB = ([0-9]+) pages of 16 tokens = ([0-9]+) KV tokens; "
                   "max-model-len 64 -> concurrency ([0-9]+) sequences at full length "
                   "\\(max-num-seqs 8\\)")))
        << log;
    const int pages = std::stoi(match[1]), tokens = std::stoi(match[2]);
    EXPECT_GT(pages, 0);
    EXPECT_EQ(tokens, pages * 16);
    EXPECT_EQ(std::stoi(match[3]), pages / (kMaxModelLen / 16));
    EXPECT_NE(log.find("worker metrics on http://"), std::string::npos) << log;  // --metrics-port
  }
  EXPECT_NE(Log("router").find("router metrics on http://"), std::string::npos);
  EXPECT_NE(Log("router").find("API key required"), std::string::npos);
}

// The workers loaded the model with --max-model-len as its context and say so in GetInfo
// (what they register with); their ports want the cluster token up gave them (--cluster-token).
TEST_F(UpFlagsTest, WorkersServeTheCappedContext) {
  for (const char* member : {"decode0", "prefill0"}) {
    SCOPED_TRACE(member);
    const std::string log = Log(member);
    std::smatch match;
    ASSERT_TRUE(std::regex_search(log, match, std::regex("worker serving on ([0-9.:]+),")))
        << log;
    auto channel = grpc::CreateChannel(match[1].str(), grpc::InsecureChannelCredentials());
    estuary::v1::WorkerInfo info;
    grpc::ClientContext context;
    const bool decode = std::string(member) == "decode0";
    auto get_info = [&](const char* token) {
      grpc::ClientContext context;
      if (token != nullptr) context.AddMetadata("x-estuary-cluster-token", token);
      return decode ? estuary::v1::DecodeWorker::NewStub(channel)->GetInfo(Context(context, ""),
                                                                            {}, &info)
                    : estuary::v1::PrefillWorker::NewStub(channel)->GetInfo(Context(context, ""),
                                                                             {}, &info);
    };
    EXPECT_EQ(get_info(nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    const grpc::Status status = get_info(kClusterToken);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(info.context_length(), kMaxModelLen);
    EXPECT_NE(log.find("cluster: token required"), std::string::npos) << log;
  }
}

TEST_F(UpFlagsTest, GrpcPortWantsTheKey) {
  estuary::v1::ModelInfo info;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetModelInfo(Context(context, ""), {}, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  }
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetModelInfo(Context(context, "wrong-key"), {}, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetModelInfo(Context(context, kKey), {}, &info);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(info.name(), kServedName);  // --served-model-name
    EXPECT_EQ(info.context_length(), kMaxModelLen);  // --max-model-len
  }
  {
    grpc::ClientContext context;
    estuary::v1::ListModelsResponse models;
    ASSERT_TRUE(stub_->ListModels(Context(context, kKey), {}, &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    EXPECT_EQ(models.models(0), kServedName);
  }
  int tokens = 0;
  EXPECT_EQ(Generate("", 4, "", &tokens).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(tokens, 0);
  const grpc::Status served = Generate(kKey, 4, kServedName, &tokens);
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(tokens, 4);
  // The model folder's name is not what is served any more.
  EXPECT_EQ(Generate(kKey, 4, "stories260K", &tokens).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(UpFlagsTest, MaxModelLenIsEnforced) {
  int tokens = 0;
  const grpc::Status refused = Generate(kKey, kMaxModelLen, "", &tokens);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find(std::to_string(kMaxModelLen)), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(tokens, 0);

  httplib::Client http("127.0.0.1", http_port_);
  http.set_read_timeout(30);
  const nlohmann::json body = {{"model", kServedName}, {"prompt", "Once upon a time"},
                               {"max_tokens", 100}};
  auto answer = http.Post("/v1/completions", {{"Authorization", std::string("Bearer ") + kKey}},
                          body.dump(), "application/json");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 400) << answer->body;
  const nlohmann::json error = nlohmann::json::parse(answer->body, nullptr, false);
  ASSERT_TRUE(error.contains("error")) << answer->body;
  EXPECT_NE(error["error"]["message"].get<std::string>().find(std::to_string(kMaxModelLen)),
            std::string::npos)
      << answer->body;
}

TEST_F(UpFlagsTest, HttpPortWantsTheKeyButProbesStayOpen) {
  httplib::Client http("127.0.0.1", http_port_);
  http.set_read_timeout(30);
  for (const httplib::Headers& headers :
       {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
        httplib::Headers{{"Authorization", kKey}}}) {
    auto refused = http.Get("/v1/models", headers);
    ASSERT_TRUE(refused) << httplib::to_string(refused.error());
    EXPECT_EQ(refused->status, 401) << refused->body;
    const nlohmann::json error = nlohmann::json::parse(refused->body, nullptr, false);
    ASSERT_TRUE(error.contains("error")) << refused->body;
    EXPECT_EQ(error["error"]["code"], 401);
    EXPECT_NE(error["error"]["message"].get<std::string>().find("API key"), std::string::npos);
  }
  auto models = http.Get("/v1/models", {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200) << models->body;
  const nlohmann::json list = nlohmann::json::parse(models->body, nullptr, false);
  ASSERT_TRUE(list.contains("data")) << models->body;
  EXPECT_EQ(list["data"][0]["id"], kServedName);

  const nlohmann::json body = {{"model", kServedName}, {"prompt", "Once upon a time"},
                               {"max_tokens", 4}, {"temperature", 0}};
  auto completion =
      http.Post("/v1/completions", {{"Authorization", std::string("bearer ") + kKey}},
                body.dump(), "application/json");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 200) << completion->body;
  auto unauthorized = http.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(unauthorized);
  EXPECT_EQ(unauthorized->status, 401);

  for (const char* open : {"/health", "/live", "/metrics"}) {
    auto probe = http.Get(open);
    ASSERT_TRUE(probe) << open;
    EXPECT_EQ(probe->status, 200) << open << ": " << probe->body;
  }
}

TEST_F(UpFlagsTest, ClientSendsTheKey) {
  const std::vector<std::string> command = {BinaryPath("cli/estuary"), "client", "--server",
                                            *router_, "--prompt", "Once upon a time",
                                            "--max-tokens", "4", "--temperature", "0", "--json"};
  absl::StatusOr<testing::ProcessResult> refused = testing::RunProcess(command, absl::Seconds(60));
  ASSERT_TRUE(refused.ok());
  EXPECT_NE(refused->exit_code, 0);
  EXPECT_NE(refused->err.find("API key"), std::string::npos) << refused->err;

  std::vector<std::string> with_key = command;
  with_key.insert(with_key.end(), {"--api-key", kKey});
  absl::StatusOr<testing::ProcessResult> served = testing::RunProcess(with_key, absl::Seconds(60));
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served->exit_code, 0) << served->err;
  const nlohmann::json out = nlohmann::json::parse(served->out, nullptr, false);
  EXPECT_TRUE(out.is_object()) << served->out;
}

TEST_F(UpFlagsTest, BenchServeSendsTheKeyFromTheEnvironmentToo) {
  const std::vector<std::string> bench = {BinaryPath("cli/estuary"), "bench-serve", "--server",
                                          *router_, "--num-requests", "2", "--input-len", "8",
                                          "--output-len", "4", "--rate", "0", "--json"};
  absl::StatusOr<testing::ProcessResult> refused = testing::RunProcess(bench, absl::Seconds(60));
  ASSERT_TRUE(refused.ok());
  EXPECT_NE(refused->exit_code, 0) << refused->out;
  EXPECT_NE(refused->err.find("UNAUTHENTICATED"), std::string::npos) << refused->err;
  // $ESTUARY_API_KEY, through env(1) (the test's own environment stays as it was).
  std::vector<std::string> with_env = {"/usr/bin/env", std::string("ESTUARY_API_KEY=") + kKey};
  with_env.insert(with_env.end(), bench.begin(), bench.end());
  absl::StatusOr<testing::ProcessResult> served = testing::RunProcess(with_env, absl::Seconds(60));
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served->exit_code, 0) << served->err;
}

}  // namespace
}  // namespace estuary
