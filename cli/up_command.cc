#include "cli/up_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "absl/time/clock.h"
#include "cli/up_supervisor.h"
#include "core/common/child_process.h"
#include "core/common/logging.h"
#include "core/common/secure_random.h"
#include "core/common/status_macros.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/api_key.h"
#include "rpc/cluster_security.h"
#include "process/byte_size.h"
#include "process/ready_file.h"
#include "process/signals.h"

namespace estuary::cli {
namespace {

namespace fs = std::filesystem;
constexpr absl::Duration kStartTimeout = absl::Seconds(120);

// A binary built beside this one: the same folder, or ../<folder>/ in a build tree.
absl::StatusOr<std::string> FindSibling(const std::string& name, const std::string& folder) {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return absl::InternalError("cannot find this executable's path");
  for (const fs::path& candidate :
       {self.parent_path() / name, self.parent_path().parent_path() / folder / name}) {
    if (fs::exists(candidate)) return candidate.string();
  }
  return absl::NotFoundError(absl::StrCat(name, " not found beside ", self.string(),
                                          " (build it: cmake --build build --target ", name, ")"));
}

void Append(std::vector<std::string>& flags, const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
}

using Member = UpMember;

absl::StatusOr<Member> Launch(const std::string& name, const std::string& binary,
                              const std::vector<std::string>& flags, const fs::path& log_dir) {
  return LaunchMember(name, binary, flags, log_dir, kStartTimeout);
}

// Waits until the router reports a decode TP size, and a prefill one when `prefill` workers were
// started (its registry has the roles asked for).
absl::Status WaitForRegistrations(const std::string& router, const std::string& api_key,
                                  bool prefill, absl::Duration timeout) {
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    rpc::AttachApiKey(context, api_key);
    estuary::v1::ModelInfo info;
    if (stub->GetModelInfo(&context, {}, &info).ok() &&
        (!prefill || info.prefill_tp_size() > 0) && info.decode_tp_size() > 0) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError("the workers did not register with the router in time");
}

// SIGTERM to `members`, then waits for each: its drain (--shutdown-timeout) and a few seconds
// more, then SIGKILL.
void Stop(absl::Span<Member> members, absl::Duration shutdown_timeout) {
  for (Member& m : members) m.process->Signal(SIGTERM);
  const absl::Duration patience = shutdown_timeout + absl::Seconds(5);
  for (Member& m : members) {
    if (!m.process->Wait(patience).ok()) {
      ESTUARY_LOG(WARNING) << m.name << " did not stop in " << absl::FormatDuration(patience)
                           << "; killing it";
      m.process->Signal(SIGKILL);
      (void)m.process->Wait(absl::Seconds(5));
    }
  }
}

// The router first (members[0]): its intake stops and its streams finish; then the workers
// drain what is left and exit.
void StopAll(std::vector<Member>& members, absl::Duration shutdown_timeout) {
  if (members.empty()) return;
  Stop(absl::MakeSpan(members).subspan(0, 1), shutdown_timeout);
  Stop(absl::MakeSpan(members).subspan(1), shutdown_timeout);
}

}  // namespace

absl::Status ValidateUpOptions(const UpOptions& options) {
  if (options.model.empty()) return absl::InvalidArgumentError("up needs a model");
  if (!options.cluster_token.empty() &&
      options.cluster_token.size() < rpc::kMinClusterTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-token has ",
                                                   options.cluster_token.size(),
                                                   " characters; use at least ",
                                                   rpc::kMinClusterTokenLength));
  }
  if (options.shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown-timeout must be >= 0");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port = ", options.port, " outside [0, 65535]"));
  }
  if (options.prefill < 0 || options.prefill > 16 || options.decode < 1 || options.decode > 16) {
    return absl::InvalidArgumentError("--prefill must be in [0, 16] and --decode in [1, 16]");
  }
  if (options.tp_prefill < 1 || options.tp_prefill > 64 || options.tp_decode < 1 ||
      options.tp_decode > 64) {
    return absl::InvalidArgumentError("--tp-prefill and --tp-decode must be in [1, 64]");
  }
  if (options.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError("--kv-cache-memory must be > 0");
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535 - 33) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-port = ", options.metrics_port,
                                                   " outside [-1, 65502]"));
  }
  return absl::OkStatus();
}

absl::Status RunUp(const UpOptions& options) {
  ESTUARY_RETURN_IF_ERROR(ValidateUpOptions(options));
  ESTUARY_ASSIGN_OR_RETURN(const std::string router_binary, FindSibling("estuary-router", "router"));
  ESTUARY_ASSIGN_OR_RETURN(const std::string prefill_binary,
                           FindSibling("estuary-prefill", "prefill"));
  ESTUARY_ASSIGN_OR_RETURN(const std::string decode_binary, FindSibling("estuary-decode", "decode"));
  const fs::path log_dir = options.log_dir.empty()
                               ? fs::temp_directory_path() / absl::StrCat("estuary-up-", ::getpid())
                               : fs::path(options.log_dir);
  std::error_code error;
  fs::create_directories(log_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", log_dir.string()));

  std::vector<Member> members;
  auto fail = [&](const absl::Status& status) {
    StopAll(members, options.shutdown_timeout);
    return absl::Status(status.code(), absl::StrCat(status.message(), " (logs in ",
                                                    log_dir.string(), ")"));
  };
  // Member i's --metrics-port (the router is member 0).
  auto metrics_flags = [&](int i) -> std::vector<std::string> {
    if (options.metrics_port < 0) return {};
    const int port = options.metrics_port == 0 ? 0 : options.metrics_port + i;
    return {"--metrics-port", std::to_string(port)};
  };
  std::vector<std::string> router_flags = {
      "--model", options.model, "--host", options.host, "--port", std::to_string(options.port),
      "--policy", options.policy, "--local-prefill-max-tokens",
      std::to_string(options.local_prefill_max_tokens), "--shutdown-timeout",
      absl::FormatDuration(options.shutdown_timeout)};
  Append(router_flags, metrics_flags(0));
  // The key reaches the router through its environment ($ESTUARY_API_KEY), not its argv
  // (which every local user can read in /proc); so does the cluster token, to every process.
  if (!options.api_key.empty()) ::setenv(rpc::kApiKeyEnv, options.api_key.c_str(), 1);
  const std::string cluster_token =
      options.cluster_token.empty() ? SecureRandomHex(32) : options.cluster_token;
  ::setenv(rpc::kClusterTokenEnv, cluster_token.c_str(), 1);
  Append(router_flags, options.router_flags);
  absl::StatusOr<Member> router = Launch("router", router_binary, router_flags, log_dir);
  if (!router.ok()) return fail(router.status());
  const std::string router_address = router->address;
  members.push_back(std::move(*router));
  const std::vector<std::string> common = {
      "--model", options.model, "--host", options.host, "--router", router_address,
      "--ucx-tls", options.ucx_tls,
      "--kv-cache-memory", process::FormatByteSize(options.kv_cache_bytes),
      "--shutdown-timeout", absl::FormatDuration(options.shutdown_timeout)};
  for (int i = 0; i < options.decode + options.prefill; ++i) {
    const bool decode = i < options.decode;
    std::vector<std::string> flags = common;
    flags.insert(flags.end(), {"--tensor-parallel-size",
                               std::to_string(decode ? options.tp_decode : options.tp_prefill)});
    if (decode && options.river) flags.push_back("--river");
    Append(flags, metrics_flags(i + 1));
    Append(flags, decode ? options.decode_flags : options.prefill_flags);
    if (!options.device.is_cpu()) {
      flags.insert(flags.end(), {"--device", absl::StrCat("cuda:", options.device.ordinal + i),
                                 "--kv-transport", "nccl"});
    }
    absl::StatusOr<Member> member =
        Launch(absl::StrCat(decode ? "decode" : "prefill", decode ? i : i - options.decode),
               decode ? decode_binary : prefill_binary, flags, log_dir);
    if (!member.ok()) return fail(member.status());
    members.push_back(std::move(*member));
  }
  if (absl::Status registered =
          WaitForRegistrations(router_address, options.api_key, options.prefill > 0, kStartTimeout);
      !registered.ok()) {
    return fail(registered);
  }
  if (!options.ready_file.empty()) {
    if (absl::Status written = process::WriteReadyFile(options.ready_file, router_address);
        !written.ok()) {
      return fail(written);
    }
  }
  std::printf("estuary up: router on %s (%d prefill x TP %d, %d decode x TP %d); logs in %s\n",
              router_address.c_str(), options.prefill, options.tp_prefill, options.decode,
              options.tp_decode, log_dir.string().c_str());
  std::fflush(stdout);

  // Until a signal or the router's exit; a worker that exits is restarted (up_supervisor.h).
  std::atomic<bool> stopping{false}, router_died{false};
  std::thread supervisor(
      [&] { SuperviseMembers(members, log_dir, stopping, router_died); });
  process::WaitForTerminationSignal();
  stopping = true;
  supervisor.join();
  std::printf("estuary up: stopping\n");
  std::fflush(stdout);
  StopAll(members, options.shutdown_timeout);
  if (router_died) {
    return absl::UnavailableError(
        absl::StrCat("the router died (logs in ", log_dir.string(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace estuary::cli
