#include "tests/e2e/cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/cluster_security.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary::testing {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / absl::StrCat("estuary-e2e-", ::getpid(), "-", name)).string();
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string LoggedAddress(const ServingProcess& process, const std::string& marker) {
  if (process.process == nullptr) return "";
  const std::string log = process.process->Log();
  const size_t at = log.find(marker);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  const size_t end = log.find_first_of("/ \n", begin);
  return log.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

ServingProcess StartWorker(const std::string& binary, const std::string& name,
                           std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--port", "0"});
  auto started = StartServing(BinaryPath(binary), flags, TempPath(name), absl::Seconds(60));
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? std::move(*started) : ServingProcess();
}

int FittingMaxTokens(const std::vector<int32_t>& prompt, int context, int wanted) {
  return std::min(wanted, context - static_cast<int>(prompt.size()));
}

estuary::v1::GenerateRequest GreedyIds(const std::vector<int32_t>& prompt, int max_tokens) {
  estuary::v1::GenerateRequest request;
  for (int32_t t : prompt) request.mutable_tokens()->add_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  return request;
}

void PrintTo(const ClusterSpec& s, std::ostream* os) {
  *os << s.model << " " << s.prefill << "P(TP" << s.tp_prefill << ") " << s.decode << "D(TP"
      << s.tp_decode << ")";
  for (const std::string& flag : s.decode_flags) *os << " " << flag;
}

ClusterSpec Spec(const std::string& model, int prefill, int decode, int tp_prefill, int tp_decode,
                 std::vector<std::string> router_flags) {
  ClusterSpec spec;
  spec.model = model;
  spec.prefill = prefill;
  spec.decode = decode;
  spec.tp_prefill = tp_prefill;
  spec.tp_decode = tp_decode;
  spec.router_flags = std::move(router_flags);
  return spec;
}

Cluster::Cluster(const ClusterSpec& spec) : spec_(spec) {
  const std::string model = GoldenModelDir(spec.model);
  std::vector<std::string> router_flags = {"--model", model};
  router_flags.insert(router_flags.end(), spec.router_flags.begin(), spec.router_flags.end());
  if (!spec.api_key.empty()) router_flags.insert(router_flags.end(), {"--api-key", spec.api_key});
  if (!spec.cluster_token.empty()) {
    router_flags.insert(router_flags.end(), {"--cluster-token", spec.cluster_token});
  }
  router_ = StartWorker("router/estuary-router", "router", router_flags);
  for (int i = 0; i < spec.decode + spec.prefill; ++i) {
    const bool decode = i < spec.decode;
    workers_.push_back(StartWorker(decode ? "decode/estuary-decode" : "prefill/estuary-prefill",
                                   absl::StrCat(decode ? "decode" : "prefill", i),
                                   WorkerFlags(decode)));
  }
  stub_ = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(router_.address, grpc::InsecureChannelCredentials()));
  WaitUntilRegistered();
}

std::vector<std::string> Cluster::WorkerFlags(bool decode) const {
  std::vector<std::string> flags = {"--model",
                                    GoldenModelDir(spec_.model),
                                    "--router",
                                    router_.address,
                                    "--ucx-tls",
                                    "tcp",
                                    "--tensor-parallel-size",
                                    std::to_string(decode ? spec_.tp_decode : spec_.tp_prefill),
                                    "--kv-cache-bytes",
                                    "33554432"};
  if (!spec_.cluster_token.empty()) {
    flags.insert(flags.end(), {"--cluster-token", spec_.cluster_token});
  }
  const std::vector<std::string>& extra = decode ? spec_.decode_flags : spec_.prefill_flags;
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

ServingProcess& Cluster::RestartDecode(int i) {
  ServingProcess& slot = decode(i);
  slot = StartWorker("decode/estuary-decode", absl::StrCat("decode", i, "-again"),
                     WorkerFlags(/*decode=*/true));
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (slot.process != nullptr && absl::Now() < deadline &&
         slot.process->Log().find("registered with the router") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(slot.process, nullptr);
  return slot;
}

std::string Cluster::Logs() {
  std::string all = "router:\n" + router_.process->Log();
  for (ServingProcess& w : workers_) all += "\nworker " + w.address + ":\n" + w.process->Log();
  return all;
}

void Cluster::WaitUntilRegistered() {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    if (!spec_.api_key.empty()) context.AddMetadata("authorization", "Bearer " + spec_.api_key);
    estuary::v1::ModelInfo info;
    if (stub_->GetModelInfo(&context, {}, &info).ok() && info.decode_tp_size() > 0 &&
        (spec_.prefill == 0 || info.prefill_tp_size() > 0)) {
      context_ = info.context_length();
      return;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ADD_FAILURE() << "workers did not register:\n" << Logs();
}

Generated Generate(estuary::v1::Inference::Stub& stub, const estuary::v1::GenerateRequest& request,
                   grpc::ClientContext* context, std::atomic<int>* streaming) {
  grpc::ClientContext local;
  if (context == nullptr) {
    context = &local;
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  }
  auto reader = stub.Generate(context, request);
  Generated out;
  estuary::v1::GenerateResponse response;
  bool counted = false;  // `streaming` incremented
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      if (streaming != nullptr && !counted) streaming->fetch_add(1);
      counted = true;
      out.ids.insert(out.ids.end(), response.chunk().token_ids().begin(),
                     response.chunk().token_ids().end());
      out.logprobs.insert(out.logprobs.end(), response.chunk().logprobs().begin(),
                          response.chunk().logprobs().end());
      out.text += response.chunk().text();
    } else if (response.has_complete()) {
      out.complete = response.complete();
    }
  }
  out.status = reader->Finish();
  return out;
}

std::string RouterHttpAddress(const Cluster& cluster) {
  return LoggedAddress(cluster.router(), "OpenAI HTTP on http://");
}

int FreePages(const std::string& address, bool decode, const std::string& cluster_token) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  estuary::v1::WorkerLoad load;
  grpc::ClientContext context;
  if (!cluster_token.empty()) context.AddMetadata(rpc::kClusterTokenMetadata, cluster_token);
  const grpc::Status status =
      decode ? estuary::v1::DecodeWorker::NewStub(channel)->GetLoad(&context, {}, &load)
             : estuary::v1::PrefillWorker::NewStub(channel)->GetLoad(&context, {}, &load);
  return status.ok() ? load.free_pages() : -1;
}

}  // namespace estuary::testing
