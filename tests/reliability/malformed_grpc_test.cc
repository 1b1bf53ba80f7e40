// Malformed protobuf requests on every gRPC port (reliability C10): 10,000 raw calls per port
// (the router's Inference and WorkerRegistry services; the decode and prefill workers'
// services), sent with grpc::GenericStub as byte buffers, so that nothing on the client side
// parses or checks them: random bytes, truncated and mutated valid messages, and valid
// messages of another method. Afterwards every process still runs and the cluster serves the
// golden ids. Every call must end in a typed status: never INTERNAL, UNKNOWN, DATA_LOSS or
// UNIMPLEMENTED, a non-empty message on every error, and a request that does not parse as its
// method's message answered INVALID_ARGUMENT saying so (rpc/parse_status_interceptor.h).
//
// The cluster runs with a cluster token, as `estuary up` starts one: the raw calls carry it, so
// mutations reach the handlers behind the token check, and KV transfer descriptors are sealed by
// the decode worker (kvtransfer/descriptor_seal.h). The base messages are chosen so that no
// mutation does work that outlives its call: a Reserve that succeeds is aborted at once;
// registrations name another model (refused); the Prefill base carries a real descriptor of this
// model (its reservation aborted at once, its lease long), so a mutation of the descriptor meets
// the seal (UNAUTHENTICATED) before anything reaches UCX, and one of the rest of the request
// goes on to connect and attach, which the decode worker refuses (the reservation is gone).
// Before descriptors were sealed, such mutations crashed both workers: the prefill worker
// aborted in ucp_address_unpack (a corrupted worker address), the decode worker segfaulted in
// ucp_put_handler (a put over tcp to a corrupted base address, which UCX 1.13 does not check
// against the registration).

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/cluster_security.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;
namespace v1 = ::estuary::v1;

constexpr int kCallsPerPort = 10000;
constexpr int kClientsPerPort = 8;
constexpr char kClusterToken[] = "c10-cluster-token-0123456789";

// One method of a port: its full name, a parser for its request type, and a valid request.
struct Method {
  std::string name;  // "/estuary.v1.Inference/Generate"
  std::function<bool(const std::string&)> parses;
  std::string valid;
};

template <typename Request>
Method MakeMethod(const std::string& name, const Request& valid) {
  return {name, [](const std::string& bytes) { return Request().ParseFromString(bytes); },
          valid.SerializeAsString()};
}

// What one raw call ended with.
struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;  // serialized response messages
};

// Raw calls on one channel: every method as a generic stream (request, writes done, read to
// the end), which is how a unary or server-streaming call looks on the wire.
class RawCaller {
 public:
  explicit RawCaller(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {}

  RawResult Call(const std::string& method, const std::string& bytes, absl::Duration timeout) {
    RawResult result;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    context.AddMetadata(rpc::kClusterTokenMetadata, kClusterToken);
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub_.PrepareCall(&context, method, &queue_);
    call->StartCall(Tag(1));
    bool ok = Wait(1);
    if (ok) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer request(&slice, 1);
      call->Write(request, Tag(2));
      ok = Wait(2);
    }
    if (ok) {
      call->WritesDone(Tag(3));
      ok = Wait(3);
    }
    while (ok) {
      grpc::ByteBuffer response;
      call->Read(&response, Tag(4));
      if (!Wait(4)) break;
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      std::string serialized;
      for (const grpc::Slice& s : slices) {
        serialized.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      result.responses.push_back(std::move(serialized));
    }
    call->Finish(&result.status, Tag(5));
    Wait(5);
    return result;
  }

 private:
  static void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  // One operation is outstanding at a time, so the next event is its.
  bool Wait(intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    if (!queue_.Next(&tag, &ok) || tag != Tag(expected)) ADD_FAILURE() << "completion queue";
    return ok;
  }

  grpc::GenericStub stub_;
  grpc::CompletionQueue queue_;
};

// The malformed request number `i` for a port: random bytes, a valid message cut short, a valid
// message with a few bytes changed, inserted or removed, or another method's valid message.
std::string Malformed(std::mt19937& random, const std::vector<Method>& methods,
                      const Method& method) {
  auto uniform = [&random](size_t n) {
    return std::uniform_int_distribution<size_t>(0, n == 0 ? 0 : n - 1)(random);
  };
  const size_t kind = uniform(100);
  std::string bytes;
  if (kind < 40) {
    bytes.resize(uniform(10) == 0 ? uniform(4096) : uniform(64));
    for (char& c : bytes) c = static_cast<char>(uniform(256));
  } else if (kind < 60) {
    bytes = method.valid.substr(0, uniform(method.valid.size()));
  } else if (kind < 90) {
    bytes = method.valid;
    for (size_t edits = 1 + uniform(8); edits > 0; --edits) {
      const size_t at = uniform(bytes.size() + 1);
      switch (uniform(3)) {
        case 0:
          if (at < bytes.size()) bytes[at] = static_cast<char>(uniform(256));
          break;
        case 1:
          bytes.insert(at, 1, static_cast<char>(uniform(256)));
          break;
        case 2:
          if (at < bytes.size()) bytes.erase(at, 1);
          break;
      }
    }
  } else {
    bytes = methods[uniform(methods.size())].valid;
  }
  return bytes;
}

// Whether a process is still running (not exited, not killed).
bool Running(const ServingProcess& p) {
  return p.process != nullptr && !p.process->Wait(absl::ZeroDuration()).ok();
}

struct PortReport {
  std::map<grpc::StatusCode, int> codes;
  int unparsable = 0;  // requests that do not parse as their method's message
  std::vector<std::string> violations;
  // A few refusals of requests that parsed, one per method and code (to read that they name
  // the field).
  std::map<std::string, std::string> refusals;
  int seal_refusals = 0;  // errors that name a transfer descriptor's seal
  absl::Duration took;
};

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "?";
  }
}

// Sends kCallsPerPort malformed calls to `address`, spread over `methods`, from
// kClientsPerPort threads. `after` sees every call's method and result (e.g. to abort a
// reservation that succeeded).
PortReport Hammer(const std::string& address, const std::vector<Method>& methods, int seed,
                  const std::function<void(const Method&, const RawResult&)>& after = nullptr) {
  PortReport report;
  absl::Mutex mu;
  std::atomic<int> next{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClientsPerPort; ++c) {
    clients.emplace_back([&, c] {
      RawCaller caller(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      std::mt19937 random(static_cast<uint32_t>(seed * 1000 + c));
      for (int i = next.fetch_add(1); i < kCallsPerPort; i = next.fetch_add(1)) {
        const Method& method = methods[static_cast<size_t>(i) % methods.size()];
        const std::string bytes = Malformed(random, methods, method);
        const bool parses = method.parses(bytes);
        const RawResult result = caller.Call(method.name, bytes, absl::Seconds(5));
        if (after) after(method, result);
        const grpc::StatusCode code = result.status.error_code();
        std::string violation;
        if (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
            code == grpc::StatusCode::DATA_LOSS || code == grpc::StatusCode::UNIMPLEMENTED) {
          violation = "untyped status";
        } else if (!result.status.ok() && result.status.error_message().empty()) {
          violation = "an error without a message";
        } else if (!parses && (code != grpc::StatusCode::INVALID_ARGUMENT ||
                               result.status.error_message().find("did not parse") ==
                                   std::string::npos)) {
          violation = "an unparsable request not answered INVALID_ARGUMENT 'did not parse'";
        }
        absl::MutexLock lock(&mu);
        ++report.codes[code];
        if (!parses) ++report.unparsable;
        if (absl::StrContains(result.status.error_message(), "seal")) ++report.seal_refusals;
        if (parses && !result.status.ok()) {
          report.refusals.try_emplace(absl::StrCat(method.name, " ", CodeName(code)),
                                      result.status.error_message());
        }
        if (!violation.empty() && report.violations.size() < 10) {
          report.violations.push_back(absl::StrCat(method.name, ": ", violation, ": ",
                                                   CodeName(code), " '",
                                                   result.status.error_message(), "'"));
        }
      }
    });
  }
  for (std::thread& c : clients) c.join();
  report.took = absl::Now() - start;
  return report;
}

std::string Summary(const PortReport& r) {
  std::string s;
  for (const auto& [code, n] : r.codes) absl::StrAppend(&s, s.empty() ? "" : " ", CodeName(code), " ", n);
  return s;
}

v1::WorkerRequest WorkerRequestFor(const std::vector<int32_t>& prompt, const std::string& id) {
  v1::WorkerRequest request;
  request.set_request_id(id);
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(4);
  return request;
}

TEST(MalformedGrpcTest, TenThousandMalformedRequestsPerPortEndTypedAndTheClusterStillServes) {
  // The test parses every request itself to know which ones cannot parse; protobuf would log
  // each invalid UTF-8 string it meets.
  google::protobuf::LogSilencer quiet;
  t::ClusterSpec spec = t::Spec("stories260K", 1, 1, 1, 1);
  spec.cluster_token = kClusterToken;
  t::Cluster cluster(spec);
  const std::string router = cluster.router_address();
  const std::string decode = cluster.decode(0).address;
  const std::string prefill = cluster.prefill(0).address;
  const t::GoldenCase golden = t::LoadGoldenCases("stories260K").at(0);
  const std::vector<int32_t> prompt(golden.prompt_ids.begin(),
                                    golden.prompt_ids.begin() +
                                        std::min<size_t>(8, golden.prompt_ids.size()));

  // Router: the public API and the registry (workers register on the client port today).
  v1::GenerateRequest generate = cluster.Greedy(prompt, 4);
  v1::AbortRequest abort;
  abort.set_request_id("c10-unknown");
  v1::GetModelInfoRequest model_info;
  model_info.set_model("stories260K");
  v1::RegisterRequest registration;
  v1::WorkerInfo* info = registration.mutable_info();
  info->set_worker_id("c10-fake");
  info->set_role(v1::WORKER_ROLE_DECODE);
  info->set_address("127.0.0.1:1");
  info->set_model_id("c10-another-model");  // refused, and so is every mutation of it
  info->set_block_size(16);
  info->set_tp_size(1);
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("c10-fake");
  v1::UnregisterRequest unregister;
  unregister.set_worker_id("c10-fake");
  const std::vector<Method> router_methods = {
      MakeMethod("/estuary.v1.Inference/Generate", generate),
      MakeMethod("/estuary.v1.Inference/Abort", abort),
      MakeMethod("/estuary.v1.Inference/ListModels", v1::ListModelsRequest()),
      MakeMethod("/estuary.v1.Inference/GetModelInfo", model_info),
      MakeMethod("/estuary.v1.WorkerRegistry/Register", registration),
      MakeMethod("/estuary.v1.WorkerRegistry/Heartbeat", heartbeat),
      MakeMethod("/estuary.v1.WorkerRegistry/Unregister", unregister)};

  // Decode worker.
  v1::ReserveRequest reserve;
  *reserve.mutable_request() = WorkerRequestFor(prompt, "c10-reserve");
  reserve.set_lease_ms(2000);
  v1::DecodeRequest local;
  *local.mutable_local_prefill() = WorkerRequestFor(prompt, "c10-local");
  v1::WorkerAbortRequest worker_abort;
  worker_abort.set_request_id("c10-unknown");
  const std::vector<Method> decode_methods = {
      MakeMethod("/estuary.v1.DecodeWorker/Reserve", reserve),
      MakeMethod("/estuary.v1.DecodeWorker/Decode", local),
      MakeMethod("/estuary.v1.DecodeWorker/Abort", worker_abort),
      MakeMethod("/estuary.v1.DecodeWorker/GetLoad", v1::GetLoadRequest()),
      MakeMethod("/estuary.v1.DecodeWorker/GetInfo", v1::GetInfoRequest())};

  // Prefill worker: a real, sealed descriptor of this model, whose reservation is aborted at
  // once; its lease outlasts the test, so requests that keep the seal valid get as far as the
  // attach.
  v1::PrefillRequest prefill_request;
  *prefill_request.mutable_request() = WorkerRequestFor(prompt, "c10-descriptor");
  {
    v1::ReserveResponse reserved;
    grpc::ClientContext context;
    context.AddMetadata(rpc::kClusterTokenMetadata, kClusterToken);
    auto channel = grpc::CreateChannel(decode, grpc::InsecureChannelCredentials());
    v1::ReserveRequest real = reserve;
    real.mutable_request()->set_request_id("c10-descriptor");
    real.set_lease_ms(600000);
    const grpc::Status made = v1::DecodeWorker::NewStub(channel)->Reserve(&context, real, &reserved);
    ASSERT_TRUE(made.ok()) << made.error_message();
    ASSERT_FALSE(reserved.transfer().seal().empty()) << "the decode worker did not seal";
    *prefill_request.mutable_transfer() = reserved.transfer();
    grpc::ClientContext abort_context;
    abort_context.AddMetadata(rpc::kClusterTokenMetadata, kClusterToken);
    v1::WorkerAbortRequest free_it;
    free_it.set_request_id("c10-descriptor");
    v1::WorkerAbortResponse freed;
    ASSERT_TRUE(
        v1::DecodeWorker::NewStub(channel)->Abort(&abort_context, free_it, &freed).ok());
  }
  const std::vector<Method> prefill_methods = {
      MakeMethod("/estuary.v1.PrefillWorker/Prefill", prefill_request),
      MakeMethod("/estuary.v1.PrefillWorker/Abort", worker_abort),
      MakeMethod("/estuary.v1.PrefillWorker/GetLoad", v1::GetLoadRequest()),
      MakeMethod("/estuary.v1.PrefillWorker/GetInfo", v1::GetInfoRequest())};
  const int decode_free = t::FreePages(decode, true, kClusterToken);
  ASSERT_GT(decode_free, 0);

  // A reservation that a mutation made goes back at once (not at its lease).
  auto decode_channel = grpc::CreateChannel(decode, grpc::InsecureChannelCredentials());
  std::atomic<int> reservations{0};
  auto free_reservations = [&](const Method& method, const RawResult& result) {
    if (method.name != "/estuary.v1.DecodeWorker/Reserve" || !result.status.ok()) return;
    v1::ReserveResponse reserved;
    if (result.responses.empty() || !reserved.ParseFromString(result.responses[0])) return;
    reservations.fetch_add(1);
    grpc::ClientContext context;
    context.AddMetadata(rpc::kClusterTokenMetadata, kClusterToken);
    v1::WorkerAbortRequest request;
    request.set_request_id(reserved.transfer().request_id());
    v1::WorkerAbortResponse response;
    (void)v1::DecodeWorker::NewStub(decode_channel)->Abort(&context, request, &response);
  };

  const struct {
    const char* name;
    std::string address;
    const std::vector<Method>* methods;
    std::function<void(const Method&, const RawResult&)> after;
  } ports[] = {{"router", router, &router_methods, nullptr},
               {"decode", decode, &decode_methods, free_reservations},
               {"prefill", prefill, &prefill_methods, nullptr}};
  int seed = 1;
  for (const auto& port : ports) {
    const PortReport report = Hammer(port.address, *port.methods, seed++, port.after);
    std::printf("[figure] C10 %s port: %d malformed calls (%d unparsable) in %.1f s: %s\n",
                port.name, kCallsPerPort, report.unparsable, absl::ToDoubleSeconds(report.took),
                Summary(report).c_str());
    for (const auto& [what, message] : report.refusals) {
      std::printf("  %s: %s\n", what.c_str(), message.substr(0, 160).c_str());
    }
    for (const std::string& v : report.violations) ADD_FAILURE() << v;
    EXPECT_GT(report.unparsable, kCallsPerPort / 5);  // the mix reaches the parser's refusals
    if (port.address == prefill) {
      // Mutated descriptors reach the seal check, and it names what it refuses.
      std::printf("[figure] C10 prefill port: %d calls refused for the descriptor's seal\n",
                  report.seal_refusals);
      EXPECT_GT(report.seal_refusals, kCallsPerPort / 100);
    }
    EXPECT_TRUE(Running(cluster.router())) << cluster.Logs();
    EXPECT_TRUE(Running(cluster.decode(0))) << cluster.Logs();
    EXPECT_TRUE(Running(cluster.prefill(0))) << cluster.Logs();
  }
  std::printf("[figure] C10 reservations made by mutated Reserve calls (each aborted): %d\n",
              reservations.load());

  // Nothing leaked on the decode worker, and the cluster still serves the golden ids.
  absl::Time until = absl::Now() + absl::Seconds(5);
  while (t::FreePages(decode, true, kClusterToken) != decode_free && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(t::FreePages(decode, true, kClusterToken), decode_free);
  const t::Generated after = t::Generate(cluster.stub(), cluster.Greedy(golden.prompt_ids));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << cluster.Logs();
  EXPECT_EQ(after.ids, golden.completion_ids);
}

}  // namespace
}  // namespace estuary
