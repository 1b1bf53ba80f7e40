// Security (issue 14, item 4; reliability C13) against real processes. Certificates are made at
// test time with Debian's openssl (a cluster CA, a stranger CA, a public CA for the client
// port). Checked:
//   - a whole cluster (router, prefill, decode; KV over UCX) with mutual TLS and the cluster
//     token on every internal port serves the golden ids to a TLS client with the API key;
//   - every internal port (both workers, the router's cluster port) refuses a client without a
//     certificate, one with a certificate from another CA, and one with a good certificate but
//     no token; the client port refuses a missing or wrong key, plaintext, and answers HTTPS;
//   - without TLS, a worker without the cluster token cannot register, and internal calls
//     without it are refused (health stays open for probes);
//   - a rotated certificate is picked up without a restart;
//   - request ids are unguessable, and an Abort from another caller does nothing.
// The figures are printed ("[figure]") for README's table.

#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
namespace t = ::estuary::testing;

constexpr char kToken[] = "0123456789abcdef-cluster-token";
constexpr char kApiKey[] = "sk-security-test";
constexpr char kTokenKey[] = "x-estuary-cluster-token";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Debian's openssl command (scripts/test.sh installs it); RunProcess does not search PATH.
std::string Openssl() {
  for (const char* path : {"/usr/bin/openssl", "/bin/openssl", "/usr/local/bin/openssl"}) {
    if (fs::exists(path)) return path;
  }
  return "openssl";
}

// A CA and certificates signed by it, made with the openssl command line.
class Pki {
 public:
  explicit Pki(std::string dir) : dir_(std::move(dir)) { fs::create_directories(dir_); }

  std::string Path(const std::string& name, const char* ext) const {
    return absl::StrCat(dir_, "/", name, ext);
  }
  std::string Crt(const std::string& name) const { return Path(name, ".crt"); }
  std::string Key(const std::string& name) const { return Path(name, ".key"); }

  // A self-signed CA `name`; false (with the error recorded) when openssl fails.
  bool MakeCa(const std::string& name) {
    return Run({Openssl(), "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:P-256", "-nodes", "-keyout", Key(name), "-out", Crt(name),
                "-days", "2", "-subj", "/CN=" + name});
  }
  // A certificate `name` for both TLS roles, signed by `ca`, with subject alternative names
  // `san` (e.g. "DNS:estuary-node,IP:127.0.0.1").
  bool MakeCert(const std::string& name, const std::string& ca, const std::string& san) {
    const std::string ext = Path(name, ".ext");
    std::ofstream(ext) << "subjectAltName=" << san
                       << "\nextendedKeyUsage=serverAuth,clientAuth\n";
    return Run({Openssl(), "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", Key(name), "-out", Path(name, ".csr"), "-subj",
                "/CN=" + name}) &&
           Run({Openssl(), "x509", "-req", "-in", Path(name, ".csr"), "-CA", Crt(ca), "-CAkey",
                Key(ca), "-CAcreateserial", "-out", Crt(name), "-days", "2", "-extfile", ext});
  }
  const std::string& error() const { return error_; }

 private:
  bool Run(const std::vector<std::string>& argv) {
    absl::StatusOr<t::ProcessResult> r = t::RunProcess(argv, absl::Seconds(30));
    if (r.ok() && r->exit_code == 0) return true;
    error_ = r.ok() ? r->err : std::string(r.status().message());
    return false;
  }

  std::string dir_;
  std::string error_;
};

// TLS credentials of a test client: trusting `ca`, presenting `cert` when given.
std::shared_ptr<grpc::ChannelCredentials> TlsClient(const Pki& pki, const std::string& ca,
                                                    const std::string& cert = "") {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(pki.Crt(ca));
  if (!cert.empty()) {
    options.pem_cert_chain = ReadFile(pki.Crt(cert));
    options.pem_private_key = ReadFile(pki.Key(cert));
  }
  return grpc::SslCredentials(options);
}

// A channel of its own (no subchannel shared with earlier channels: a fresh handshake).
std::shared_ptr<grpc::Channel> FreshChannel(const std::string& address,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, std::move(credentials), args);
}

grpc::ClientContext& Deadline(grpc::ClientContext& context, absl::Duration d = absl::Seconds(5)) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + d));
  return context;
}

// GetInfo on a worker port (DecodeWorker or PrefillWorker), with the token when `token`.
grpc::Status WorkerGetInfo(const std::shared_ptr<grpc::Channel>& channel, bool decode, bool token,
                           std::string* server_identity = nullptr) {
  grpc::ClientContext context;
  Deadline(context);
  if (token) context.AddMetadata(kTokenKey, kToken);
  estuary::v1::WorkerInfo info;
  const grpc::Status status =
      decode ? estuary::v1::DecodeWorker::NewStub(channel)->GetInfo(&context, {}, &info)
             : estuary::v1::PrefillWorker::NewStub(channel)->GetInfo(&context, {}, &info);
  if (server_identity != nullptr && context.auth_context() != nullptr) {
    server_identity->clear();
    for (const grpc::string_ref& v : context.auth_context()->GetPeerIdentity()) {
      server_identity->append(v.data(), v.size()).append(",");
    }
  }
  return status;
}

// Register on the router's registry with a minimal WorkerInfo.
grpc::Status RegisterCall(const std::shared_ptr<grpc::Channel>& channel, bool token) {
  grpc::ClientContext context;
  Deadline(context);
  if (token) context.AddMetadata(kTokenKey, kToken);
  estuary::v1::RegisterRequest request;
  request.mutable_info()->set_worker_id("intruder");
  request.mutable_info()->set_role(estuary::v1::WORKER_ROLE_DECODE);
  request.mutable_info()->set_address("127.0.0.1:1");
  request.mutable_info()->set_block_size(16);
  request.mutable_info()->set_model_id("not-this-model");
  estuary::v1::RegisterResponse response;
  return estuary::v1::WorkerRegistry::NewStub(channel)->Register(&context, request, &response);
}

grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  Deadline(context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("liveness");
  grpc::health::v1::HealthCheckResponse response;
  return grpc::health::v1::Health::NewStub(channel)->Check(&context, request, &response);
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // This process's HTTPS client writes through OpenSSL, which may raise SIGPIPE when a
    // handshake it refused closes the socket (the servers ignore it: process/signals.h).
    ::signal(SIGPIPE, SIG_IGN);
    pki_ = new Pki(t::TempPath("pki"));
    const bool made =
        pki_->MakeCa("cluster-ca") && pki_->MakeCa("stranger-ca") && pki_->MakeCa("public-ca") &&
        pki_->MakeCert("node", "cluster-ca", "DNS:estuary-node,IP:127.0.0.1") &&
        pki_->MakeCert("node-rotated", "cluster-ca", "DNS:estuary-node-rotated,IP:127.0.0.1") &&
        pki_->MakeCert("stranger", "stranger-ca", "DNS:stranger,IP:127.0.0.1") &&
        pki_->MakeCert("router-public", "public-ca", "DNS:localhost,IP:127.0.0.1") &&
        pki_->MakeCa("public-ca-2") &&
        pki_->MakeCert("router-public-2", "public-ca-2", "DNS:localhost,IP:127.0.0.1");
    if (!made) openssl_error_ = new std::string(pki_->error());
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    if (openssl_error_ != nullptr) GTEST_SKIP() << "openssl could not make the test PKI: " << *openssl_error_;
  }

  static std::vector<std::string> MutualTlsFlags(const std::string& cert = "node") {
    return {"--cluster-ca-file", pki_->Crt("cluster-ca"), "--cluster-cert-file",
            pki_->Crt(cert), "--cluster-key-file", pki_->Key(cert)};
  }

  static Pki* pki_;
  static std::string* openssl_error_;
};
Pki* SecurityTest::pki_ = nullptr;
std::string* SecurityTest::openssl_error_ = nullptr;

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Waits until the router (through `stub`) lists a decode and, when `prefill`, a prefill worker.
bool WaitForWorkers(estuary::v1::Inference::Stub& stub, bool prefill, int* context_length) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    Deadline(context);
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kApiKey));
    estuary::v1::ModelInfo info;
    if (stub.GetModelInfo(&context, {}, &info).ok() && info.decode_tp_size() > 0 &&
        (!prefill || info.prefill_tp_size() > 0)) {
      *context_length = info.context_length();
      return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// The whole cluster with mutual TLS between its processes, the cluster token, TLS and an API
// key on the client port: golden ids served; every internal port refuses strangers.
TEST_F(SecurityTest, AMutualTlsClusterServesTheGoldenIdsAndRefusesStrangersOnEveryInternalPort) {
  const std::string model = t::GoldenModelDir("stories260K");
  const std::vector<std::string> cluster_flags =
      Concat(MutualTlsFlags(), {"--cluster-token", kToken});
  const absl::Time start = absl::Now();
  ServingProcess router = t::StartWorker(
      "router/estuary-router", "tls-router",
      Concat({"--model", model, "--cluster-port", "0", "--api-key", kApiKey, "--ssl-certfile",
              pki_->Crt("router-public"), "--ssl-keyfile", pki_->Key("router-public"),
              "--http-port", "0"},
             cluster_flags));
  ASSERT_NE(router.process, nullptr);
  const std::string registry = t::LoggedAddress(router, "router cluster port (worker registration) on ");
  ASSERT_FALSE(registry.empty()) << router.process->Log();
  const std::vector<std::string> worker_flags =
      Concat({"--model", model, "--router", registry, "--ucx-tls", "tcp", "--kv-cache-bytes",
              "8388608"},
             cluster_flags);
  ServingProcess decode = t::StartWorker("decode/estuary-decode", "tls-decode", worker_flags);
  ServingProcess prefill = t::StartWorker("prefill/estuary-prefill", "tls-prefill", worker_flags);
  ASSERT_NE(decode.process, nullptr);
  ASSERT_NE(prefill.process, nullptr);
  auto logs = [&] {
    return absl::StrCat("router:\n", router.process->Log(), "\ndecode:\n", decode.process->Log(),
                        "\nprefill:\n", prefill.process->Log());
  };
  auto stub = estuary::v1::Inference::NewStub(
      FreshChannel(router.address, TlsClient(*pki_, "public-ca")));
  int context_length = 0;
  ASSERT_TRUE(WaitForWorkers(*stub, /*prefill=*/true, &context_length)) << logs();
  std::printf("[figure] C13 mTLS cluster (router + prefill + decode) up and registered in %.0f ms\n",
              absl::ToDoubleMilliseconds(absl::Now() - start));

  // The golden ids, disaggregated (KV over UCX between the mTLS workers).
  const std::vector<t::GoldenCase> cases = t::LoadGoldenCases("stories260K");
  ASSERT_FALSE(cases.empty());
  for (const t::GoldenCase& c : cases) {
    SCOPED_TRACE(c.index);
    const int max_tokens = t::FittingMaxTokens(c.prompt_ids, context_length);
    grpc::ClientContext context;
    Deadline(context, absl::Seconds(60));
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kApiKey));
    const t::Generated got = t::Generate(*stub, t::GreedyIds(c.prompt_ids, max_tokens), &context);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << logs();
    const std::vector<int32_t> want(
        c.completion_ids.begin(),
        c.completion_ids.begin() + std::min<size_t>(c.completion_ids.size(), max_tokens));
    EXPECT_EQ(got.ids, want);
  }

  // The client port: TLS only, and the key.
  {
    grpc::ClientContext context;
    estuary::v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(&Deadline(context), {}, &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext wrong;
    wrong.AddMetadata("authorization", "Bearer sk-wrong");
    EXPECT_EQ(stub->GetModelInfo(&Deadline(wrong), {}, &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    auto plain = estuary::v1::Inference::NewStub(
        FreshChannel(router.address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext cleartext;
    cleartext.AddMetadata("authorization", absl::StrCat("Bearer ", kApiKey));
    EXPECT_EQ(plain->GetModelInfo(&Deadline(cleartext, absl::Seconds(2)), {}, &info).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  // The HTTP door speaks HTTPS with the same certificate and key.
  {
    const std::string http = t::LoggedAddress(router, "OpenAI HTTP on https://");
    ASSERT_FALSE(http.empty()) << router.process->Log();
    httplib::Client client(absl::StrCat("https://", http));
    client.set_ca_cert_path(pki_->Crt("public-ca").c_str());
    client.set_connection_timeout(std::chrono::seconds(5));
    httplib::Result models =
        client.Get("/v1/models", {{"Authorization", absl::StrCat("Bearer ", kApiKey)}});
    ASSERT_TRUE(models) << httplib::to_string(models.error());
    EXPECT_EQ(models->status, 200) << models->body;
    httplib::Result anonymous = client.Get("/v1/models");
    ASSERT_TRUE(anonymous);
    EXPECT_EQ(anonymous->status, 401);
  }

  // The command-line clients speak TLS with --ssl-ca-certs: estuary client over gRPC,
  // bench-serve over gRPC and over HTTPS.
  {
    const std::string http = t::LoggedAddress(router, "OpenAI HTTP on https://");
    const std::vector<std::string> tls = {"--ssl-ca-certs", pki_->Crt("public-ca"), "--api-key",
                                          kApiKey};
    absl::StatusOr<t::ProcessResult> client = t::RunProcess(
        Concat({t::BinaryPath("cli/estuary"), "client", "--server", router.address, "--prompt",
                "Once upon a time", "--max-tokens", "8", "--json"},
               tls),
        absl::Seconds(60));
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ(client->exit_code, 0) << client->err;
    EXPECT_TRUE(absl::StrContains(client->out, "completion_ids")) << client->out;
    for (const std::vector<std::string>& target :
         {std::vector<std::string>{"--server", router.address},
          std::vector<std::string>{"--backend", "openai", "--server", http}}) {
      absl::StatusOr<t::ProcessResult> bench = t::RunProcess(
          Concat(Concat({t::BinaryPath("cli/estuary"), "bench-serve", "--num-requests", "2",
                         "--input-len", "8", "--output-len", "8", "--rate", "0", "--json"},
                        target),
                 tls),
          absl::Seconds(60));
      ASSERT_TRUE(bench.ok()) << bench.status();
      EXPECT_EQ(bench->exit_code, 0) << bench->err;
      EXPECT_TRUE(absl::StrContains(bench->out, "\"completed\": 2") ||
                  absl::StrContains(bench->out, "\"completed\":2"))
          << bench->out << bench->err;
    }
  }

  // Every internal port: no certificate, a stranger's certificate, a good one without the
  // token, plaintext: refused; a good certificate with the token: served.
  struct Port {
    const char* name;
    std::string address;
    enum { kDecode, kPrefill, kRegistry } kind;
  };
  const std::vector<Port> ports = {{"decode", decode.address, Port::kDecode},
                                   {"prefill", prefill.address, Port::kPrefill},
                                   {"router cluster port", registry, Port::kRegistry}};
  for (const Port& port : ports) {
    SCOPED_TRACE(port.name);
    auto call = [&](std::shared_ptr<grpc::ChannelCredentials> credentials, bool token) {
      auto channel = FreshChannel(port.address, std::move(credentials));
      return port.kind == Port::kRegistry ? RegisterCall(channel, token)
                                          : WorkerGetInfo(channel, port.kind == Port::kDecode, token);
    };
    const absl::Time refused_start = absl::Now();
    const grpc::Status no_cert = call(TlsClient(*pki_, "cluster-ca"), true);
    const absl::Duration refused_in = absl::Now() - refused_start;
    EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAVAILABLE) << no_cert.error_message();
    EXPECT_EQ(call(TlsClient(*pki_, "cluster-ca", "stranger"), true).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(call(grpc::InsecureChannelCredentials(), true).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    const grpc::Status no_token = call(TlsClient(*pki_, "cluster-ca", "node"), false);
    EXPECT_EQ(no_token.error_code(), grpc::StatusCode::UNAUTHENTICATED) << no_token.error_message();
    const grpc::Status with_token = call(TlsClient(*pki_, "cluster-ca", "node"), true);
    if (port.kind == Port::kRegistry) {
      // Through both gates, the registry itself refuses the intruder's other model.
      EXPECT_EQ(with_token.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << with_token.error_message();
    } else {
      EXPECT_TRUE(with_token.ok()) << with_token.error_message();
    }
    std::printf("[figure] C13 %s: a client without a certificate refused in %.1f ms\n", port.name,
                absl::ToDoubleMilliseconds(refused_in));
  }
  // A certificate of the cluster CA presents no host name for the worker's address; the
  // router's workers still verify by chain: the cluster serves (above). A worker with a
  // stranger's certificate fails every handshake with the router, so it never registers.
  ServingProcess stranger = t::StartWorker(
      "decode/estuary-decode", "tls-stranger",
      Concat({"--model", model, "--router", registry, "--ucx-tls", "tcp", "--kv-cache-bytes",
              "8388608", "--cluster-token", kToken, "--cluster-ca-file", pki_->Crt("stranger-ca"),
              "--cluster-cert-file", pki_->Crt("stranger"), "--cluster-key-file",
              pki_->Key("stranger")},
             {}));
  ASSERT_NE(stranger.process, nullptr);
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_FALSE(absl::StrContains(stranger.process->Log(), "registered with the router"))
      << stranger.process->Log();
  EXPECT_FALSE(absl::StrContains(router.process->Log(), stranger.address)) << router.process->Log();
}

// Without TLS the token is the gate: a worker without it cannot register, internal calls
// without it are refused, health checks (probes) are not.
TEST_F(SecurityTest, WithoutTlsAWorkerWithoutTheClusterTokenCannotRegister) {
  const std::string model = t::GoldenModelDir("stories260K");
  ServingProcess router = t::StartWorker(
      "router/estuary-router", "token-router",
      {"--model", model, "--api-key", kApiKey, "--cluster-token", kToken});
  ASSERT_NE(router.process, nullptr);
  const std::vector<std::string> common = {"--model", model, "--router", router.address,
                                           "--ucx-tls", "tcp", "--kv-cache-bytes", "8388608"};
  ServingProcess decode = t::StartWorker("decode/estuary-decode", "token-decode",
                                         Concat(common, {"--cluster-token", kToken}));
  ServingProcess tokenless = t::StartWorker("prefill/estuary-prefill", "tokenless-prefill", common);
  ServingProcess wrong = t::StartWorker(
      "prefill/estuary-prefill", "wrong-token-prefill",
      Concat(common, {"--cluster-token", "another-token-of-16-chars"}));
  ASSERT_NE(decode.process, nullptr);
  ASSERT_NE(tokenless.process, nullptr);
  ASSERT_NE(wrong.process, nullptr);
  auto stub = estuary::v1::Inference::NewStub(
      FreshChannel(router.address, grpc::InsecureChannelCredentials()));
  int context_length = 0;
  ASSERT_TRUE(WaitForWorkers(*stub, /*prefill=*/false, &context_length)) << router.process->Log();
  // Both prefill workers have tried by now (they register as soon as they serve): refused.
  absl::SleepFor(absl::Milliseconds(1000));
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kApiKey));
    estuary::v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&Deadline(context), {}, &info).ok());
    EXPECT_EQ(info.prefill_tp_size(), 0) << "a prefill worker without the token registered";
  }
  for (ServingProcess* w : {&tokenless, &wrong}) {
    EXPECT_TRUE(absl::StrContains(w->process->Log(), "refused worker"))
        << w->process->Log();
    EXPECT_TRUE(absl::StrContains(w->process->Log(), "cluster's token")) << w->process->Log();
  }
  // The registered decode worker's port: the token or nothing; health stays open.
  auto channel = FreshChannel(decode.address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(WorkerGetInfo(channel, true, false).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(WorkerGetInfo(channel, true, true).ok());
  EXPECT_TRUE(HealthCheck(channel).ok());
  // Registration on the router's port wants the token as well.
  auto router_channel = FreshChannel(router.address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(RegisterCall(router_channel, false).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // And the local-prefill cluster serves.
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", kApiKey));
  const t::Generated got =
      t::Generate(*stub, t::GreedyIds(c.prompt_ids, 16), &Deadline(context, absl::Seconds(60)));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, std::vector<int32_t>(c.completion_ids.begin(), c.completion_ids.begin() + 16));
}

// A worker's certificate is replaced on disk; new connections get the new one, no restart.
TEST_F(SecurityTest, ARotatedCertificateIsPickedUpWithoutARestart) {
  const std::string dir = t::TempPath("rotation");
  fs::create_directories(dir);
  const std::string cert = dir + "/tls.crt", key = dir + "/tls.key";
  fs::copy_file(pki_->Crt("node"), cert, fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Key("node"), key, fs::copy_options::overwrite_existing);
  ServingProcess worker = t::StartWorker(
      "decode/estuary-decode", "rotation-decode",
      {"--model", t::GoldenModelDir("stories260K"), "--ucx-tls", "tcp", "--kv-cache-bytes",
       "8388608", "--cluster-ca-file", pki_->Crt("cluster-ca"), "--cluster-cert-file", cert,
       "--cluster-key-file", key, "--tls-refresh-interval", "1s"});
  ASSERT_NE(worker.process, nullptr);
  auto identity = [&] {
    std::string id;
    const grpc::Status status = WorkerGetInfo(
        FreshChannel(worker.address, TlsClient(*pki_, "cluster-ca", "node")), true, false, &id);
    return status.ok() ? id : "error: " + status.error_message();
  };
  ASSERT_TRUE(absl::StrContains(identity(), "estuary-node,")) << identity();
  // The new pair renamed into place, key first (a key that does not match its certificate
  // is not taken, so the half-rotated state serves the old pair).
  fs::copy_file(pki_->Key("node-rotated"), key + ".new", fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Crt("node-rotated"), cert + ".new", fs::copy_options::overwrite_existing);
  const absl::Time rotated = absl::Now();
  fs::rename(key + ".new", key);
  fs::rename(cert + ".new", cert);
  std::string seen;
  while (absl::Now() - rotated < absl::Seconds(10)) {
    seen = identity();
    if (absl::StrContains(seen, "estuary-node-rotated")) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(absl::StrContains(seen, "estuary-node-rotated")) << seen << "\n" << worker.process->Log();
  std::printf("[figure] C13 rotated certificate served after %.0f ms (--tls-refresh-interval 1s)\n",
              absl::ToDoubleMilliseconds(absl::Now() - rotated));
}

// The router's client ports (gRPC and HTTPS) take a new certificate without a restart too: one
// from another CA, which a client trusting only that CA accepts once it is in place.
TEST_F(SecurityTest, TheClientPortsTakeARotatedCertificateWithoutARestart) {
  const std::string dir = t::TempPath("client-rotation");
  fs::create_directories(dir);
  const std::string cert = dir + "/tls.crt", key = dir + "/tls.key";
  fs::copy_file(pki_->Crt("router-public"), cert, fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Key("router-public"), key, fs::copy_options::overwrite_existing);
  ServingProcess router = t::StartWorker(
      "router/estuary-router", "rotation-router",
      {"--model", t::GoldenModelDir("stories260K"), "--ssl-certfile", cert, "--ssl-keyfile", key,
       "--http-port", "0", "--tls-refresh-interval", "1s"});
  ASSERT_NE(router.process, nullptr);
  const std::string http = t::LoggedAddress(router, "OpenAI HTTP on https://");
  ASSERT_FALSE(http.empty()) << router.process->Log();
  auto https_ok = [&](const char* ca) {
    httplib::Client client(absl::StrCat("https://", http));
    client.set_ca_cert_path(pki_->Crt(ca).c_str());
    client.set_connection_timeout(std::chrono::seconds(2));
    httplib::Result got = client.Get("/live");
    return got && got->status == 200;
  };
  auto grpc_ok = [&](const char* ca) {
    return HealthCheck(FreshChannel(router.address, TlsClient(*pki_, ca))).ok();
  };
  EXPECT_TRUE(https_ok("public-ca"));
  EXPECT_TRUE(grpc_ok("public-ca"));
  EXPECT_FALSE(https_ok("public-ca-2"));
  EXPECT_FALSE(grpc_ok("public-ca-2"));
  fs::copy_file(pki_->Key("router-public-2"), key + ".new", fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Crt("router-public-2"), cert + ".new", fs::copy_options::overwrite_existing);
  const absl::Time rotated = absl::Now();
  fs::rename(key + ".new", key);
  fs::rename(cert + ".new", cert);
  bool https = false, grpc = false;
  while (absl::Now() - rotated < absl::Seconds(10) && !(https && grpc)) {
    https = https || https_ok("public-ca-2");
    grpc = grpc || grpc_ok("public-ca-2");
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(https) << router.process->Log();
  EXPECT_TRUE(grpc) << router.process->Log();
  EXPECT_FALSE(https_ok("public-ca"));
  std::printf("[figure] C13 client ports serve the rotated certificate %.0f ms after the rename\n",
              absl::ToDoubleMilliseconds(absl::Now() - rotated));
}

// Ids are unguessable; an Abort from another caller does nothing, the owner's ends the stream.
TEST_F(SecurityTest, AnAbortFromAnotherCallerDoesNothing) {
  const std::string model = t::GoldenModelDir("stories260K");
  // No --api-key: callers are told apart by what they present (their bearer value).
  ServingProcess router = t::StartWorker("router/estuary-router", "abort-router", {"--model", model});
  ASSERT_NE(router.process, nullptr);
  ServingProcess decode = t::StartWorker(
      "decode/estuary-decode", "abort-decode",
      {"--model", model, "--router", router.address, "--ucx-tls", "tcp", "--kv-cache-bytes",
       "8388608", "--debug-step-delay", "20ms"});
  ASSERT_NE(decode.process, nullptr);
  auto stub = estuary::v1::Inference::NewStub(
      FreshChannel(router.address, grpc::InsecureChannelCredentials()));
  int context_length = 0;
  {
    // WaitForWorkers sends kApiKey as its bearer: harmless on a router without a key.
    ASSERT_TRUE(WaitForWorkers(*stub, false, &context_length)) << router.process->Log();
  }
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  estuary::v1::GenerateRequest request = t::GreedyIds(c.prompt_ids, 150);
  request.mutable_sampling()->set_ignore_eos(true);  // 150 steps of >= 20 ms: 3 s at least

  grpc::ClientContext owner;
  Deadline(owner, absl::Seconds(60));
  owner.AddMetadata("authorization", "Bearer alice");
  auto reader = stub->Generate(&owner, request);
  estuary::v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response)) << router.process->Log();
  const std::string id = response.request_id();
  EXPECT_TRUE(std::regex_match(id, std::regex("req-[0-9a-f]{32}"))) << id;

  auto abort = [&](const char* bearer) {
    grpc::ClientContext context;
    Deadline(context);
    if (bearer != nullptr) context.AddMetadata("authorization", bearer);
    estuary::v1::AbortRequest request;
    request.set_request_id(id);
    estuary::v1::AbortResponse answer;
    const grpc::Status status = stub->Abort(&context, request, &answer);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return answer.found();
  };
  EXPECT_FALSE(abort("Bearer mallory"));
  EXPECT_FALSE(abort(nullptr));
  // The stream goes on: more tokens come after the strangers' aborts.
  int tokens = response.chunk().token_ids_size();
  const int before = tokens;
  while (tokens < before + 5 && reader->Read(&response)) tokens += response.chunk().token_ids_size();
  EXPECT_GE(tokens, before + 5) << "the stream ended after another caller's Abort";
  EXPECT_TRUE(abort("Bearer alice"));
  estuary::v1::FinishReason finish = estuary::v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&response)) {
    tokens += response.chunk().token_ids_size();
    if (response.has_complete()) finish = response.complete().finish_reason();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(finish, estuary::v1::FINISH_REASON_CANCELLED);
  EXPECT_LT(tokens, 150);
}

}  // namespace
}  // namespace estuary
