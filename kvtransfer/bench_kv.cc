#include "kvtransfer/bench_kv.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "estuary/v1/kv_transfer.pb.h"
#include "kvtransfer/ucx_transport.h"
#include "nlohmann/json.hpp"

namespace estuary::kvtransfer {
namespace {

constexpr absl::Duration kControlTimeout = absl::Seconds(60);

// ---- Length-prefixed frames over the parent/child socketpair ----
absl::Status WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("bench control write: ", strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (r == 0) return absl::DeadlineExceededError("bench control read timed out");
    if (r < 0 && errno == EINTR) continue;
    const ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return absl::UnavailableError("bench control channel closed");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WriteFrame(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  ESTUARY_RETURN_IF_ERROR(WriteAll(fd, reinterpret_cast<const char*>(&n), sizeof(n)));
  return WriteAll(fd, s.data(), s.size());
}

absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline) {
  uint32_t n = 0;
  ESTUARY_RETURN_IF_ERROR(ReadAll(fd, reinterpret_cast<char*>(&n), sizeof(n), deadline));
  std::string s(n, '\0');
  ESTUARY_RETURN_IF_ERROR(ReadAll(fd, s.data(), n, deadline));
  return s;
}

int64_t PageLayerBytes(const BenchKvOptions& o) {
  return int64_t{2} * o.n_kv_heads * o.block_size * o.head_dim * static_cast<int64_t>(sizeof(float));
}

// Page-aligned, zeroed (and so faulted-in) memory.
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;
AlignedBuffer AllocateTouched(size_t bytes) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  AlignedBuffer b(static_cast<char*>(std::aligned_alloc(4096, rounded)));
  if (b != nullptr) std::memset(b.get(), 0, rounded);
  return b;
}

// ---- The receiver (decode side), in the forked child ----
absl::Status ServeOneTransport(int fd, const BenchKvOptions& o, const std::string& setup) {
  std::vector<std::string> f = absl::StrSplit(setup, '\n');
  if (f.size() != 4) return absl::InvalidArgumentError("bad SETUP frame");
  UcxTransportOptions u;
  u.tls = f[1];
  u.separate_data_endpoint = f[2] == "1";
  u.busy_poll = f[3] == "1";
  ESTUARY_ASSIGN_OR_RETURN(auto transport, UcxTransport::Create(u));
  const int64_t region_bytes = o.pages_per_layer * PageLayerBytes(o);
  std::vector<AlignedBuffer> memory;
  std::vector<std::unique_ptr<RegisteredRegion>> regions;
  estuary::v1::TransferDescriptor d;
  d.set_transport("ucx");
  d.set_worker_address(transport->Address());
  d.set_tp_size(1);
  estuary::v1::KvLayoutSpec* layout = d.mutable_layout();
  layout->set_n_layers(o.n_layers);
  layout->set_n_kv_heads(o.n_kv_heads);
  layout->set_head_dim(o.head_dim);
  layout->set_block_size(o.block_size);
  layout->set_dtype("f32");
  estuary::v1::KvRankRegions* rank = d.add_ranks();
  rank->set_tp_rank(0);
  for (int l = 0; l < o.n_layers; ++l) {
    std::unique_ptr<RegisteredRegion> region;
    if (o.receiver_transport_memory) {
      ESTUARY_ASSIGN_OR_RETURN(region, transport->AllocateRegion(region_bytes));
    } else {
      memory.push_back(AllocateTouched(static_cast<size_t>(region_bytes)));
      if (memory.back() == nullptr) return absl::ResourceExhaustedError("receiver pool allocation");
      ESTUARY_ASSIGN_OR_RETURN(region, transport->RegisterRegion(memory.back().get(), region_bytes));
    }
    const RegionDescriptor rd = region->Describe();
    estuary::v1::KvRemoteRegion* r = rank->add_layers();
    r->set_base_address(rd.base);
    r->set_bytes(rd.bytes);
    r->set_rkey(rd.rkey);
    regions.push_back(std::move(region));
  }
  ESTUARY_RETURN_IF_ERROR(WriteFrame(fd, "OK" + d.SerializeAsString()));
  ESTUARY_ASSIGN_OR_RETURN(std::string peer, ReadFrame(fd, absl::Now() + kControlTimeout));
  ESTUARY_ASSIGN_OR_RETURN(auto ep, transport->Connect(peer, absl::Now() + absl::Seconds(10)));
  ESTUARY_RETURN_IF_ERROR(WriteFrame(fd, "CONNECTED"));
  while (true) {
    ESTUARY_ASSIGN_OR_RETURN(Message m, transport->ReceiveFrom(*ep, absl::Now() + kControlTimeout));
    if (m.payload == "done") break;
    estuary::v1::KvCompletion c;
    if (!c.ParseFromString(m.payload)) return absl::DataLossError("bad KvCompletion");
    ESTUARY_RETURN_IF_ERROR(
        ep->SendMessage("ack:" + c.request_id(), absl::Now() + absl::Seconds(10)));
  }
  ep.reset();
  regions.clear();
  return absl::OkStatus();
}

void ReceiverMain(int fd, const BenchKvOptions& o) {
  while (true) {
    absl::StatusOr<std::string> cmd = ReadFrame(fd, absl::InfiniteFuture());
    if (!cmd.ok() || *cmd == "EXIT") return;
    absl::Status s = ServeOneTransport(fd, o, *cmd);
    if (!WriteFrame(fd, s.ok() ? std::string("DONE") : "ERR " + s.ToString()).ok()) return;
  }
}

// ---- ucx_perftest ----
struct Child {
  pid_t pid = -1;
  int out = -1;
};

absl::StatusOr<Child> Spawn(const std::vector<std::string>& argv, const std::string& tls) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("UCX_TLS=" + tls);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  int p[2];
  if (pipe(p) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(p[1]);
  return Child{pid, p[0]};
}

// Reads everything `c` prints until it exits or `deadline` (then kills it).
std::string Collect(Child c, absl::Time deadline, bool* exited_ok) {
  std::string out;
  char buf[4096];
  while (true) {
    pollfd pfd{c.out, POLLIN, 0};
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0 || poll(&pfd, 1, static_cast<int>(ms)) <= 0) break;
    const ssize_t n = read(c.out, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(c.out);
  int status = 0;
  if (waitpid(c.pid, &status, WNOHANG) == 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  }
  *exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

// GB/s (1e9 bytes/s) of `ucx_perftest -t ucp_put_bw`, from its "Final:" line (MB/s = 2^20 B/s).
absl::StatusOr<double> RunPerftest(const BenchKvOptions& o, const std::string& tls, int64_t bytes,
                                   int iterations, int port) {
  const std::vector<std::string> common = {"-t", "ucp_put_bw", "-s", std::to_string(bytes), "-n",
                                           std::to_string(iterations), "-p", std::to_string(port)};
  std::vector<std::string> server = {o.perftest_path};
  server.insert(server.end(), common.begin(), common.end());
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  ESTUARY_ASSIGN_OR_RETURN(Child srv, Spawn(server, tls));
  std::string out;
  bool ok = false;
  for (int attempt = 0; attempt < 10 && !ok; ++attempt) {
    absl::SleepFor(absl::Milliseconds(attempt == 0 ? 200 : 300));
    ESTUARY_ASSIGN_OR_RETURN(Child cli, Spawn(client, tls));
    out = Collect(cli, absl::Now() + absl::Seconds(120), &ok);
    if (out.find("Final:") != std::string::npos) break;
  }
  bool server_ok = false;
  Collect(srv, absl::Now() + absl::Seconds(5), &server_ok);
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "Final:")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double mbps = 0;
    if (f.size() >= 7 && absl::SimpleAtod(f[6], &mbps)) return mbps * 1048576.0 / 1e9;
  }
  return absl::InternalError(absl::StrCat("ucx_perftest gave no result (UCX_TLS=", tls,
                                          ", size ", bytes, "): ", out.substr(0, 2000)));
}

struct Row {
  std::string tls;
  int64_t message_bytes = 0;
  double gbytes_per_second = 0;      // puts spread over the whole pool
  double hot_gbytes_per_second = 0;  // one source, one destination
  double p50_ms = 0;
  double p99_ms = 0;
  double perftest_gbytes_per_second = -1;  // -1: not run
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

// ---- The sender (prefill side) ----
absl::Status MeasureTransport(int fd, const BenchKvOptions& o, const BenchKvTransport& t,
                              int* port, std::vector<Row>* rows) {
  const bool tcp_only = t.tls == "tcp";
  ESTUARY_RETURN_IF_ERROR(WriteFrame(fd, absl::StrCat("SETUP\n", t.tls, "\n",
                                                      t.separate_data_endpoint ? 1 : 0, "\n",
                                                      o.receiver_busy_poll ? 1 : 0)));
  ESTUARY_ASSIGN_OR_RETURN(std::string reply, ReadFrame(fd, absl::Now() + kControlTimeout));
  if (!absl::StartsWith(reply, "OK")) return absl::InternalError("receiver: " + reply);
  estuary::v1::TransferDescriptor d;
  if (!d.ParseFromString(reply.substr(2))) return absl::DataLossError("bad descriptor");

  UcxTransportOptions u;
  u.tls = t.tls;
  u.separate_data_endpoint = t.separate_data_endpoint;
  ESTUARY_ASSIGN_OR_RETURN(auto transport, UcxTransport::Create(u));
  ESTUARY_RETURN_IF_ERROR(WriteFrame(fd, transport->Address()));
  ESTUARY_ASSIGN_OR_RETURN(auto ep,
                           transport->Connect(d.worker_address(), absl::Now() + absl::Seconds(10)));
  ESTUARY_ASSIGN_OR_RETURN(std::string connected, ReadFrame(fd, absl::Now() + kControlTimeout));
  if (connected != "CONNECTED") return absl::InternalError("receiver: " + connected);
  std::vector<const RemoteRegion*> layers;
  for (const auto& r : d.ranks(0).layers()) {
    ESTUARY_ASSIGN_OR_RETURN(const RemoteRegion* rr,
                             ep->ImportRegion(RegionDescriptor{r.base_address(), r.bytes(), r.rkey()}));
    layers.push_back(rr);
  }

  const int64_t page = PageLayerBytes(o);
  const int64_t region_bytes = o.pages_per_layer * page;
  const int pages_per_request = (o.prompt_tokens + o.block_size - 1) / o.block_size;
  const int64_t run = pages_per_request * page;  // one layer's pages of one request
  const int64_t src_bytes = std::max<int64_t>(o.n_layers * run, o.message_bytes.empty() ? 0 :
      *std::max_element(o.message_bytes.begin(), o.message_bytes.end()));
  AlignedBuffer src = AllocateTouched(static_cast<size_t>(src_bytes));
  if (src == nullptr) return absl::ResourceExhaustedError("sender buffer");
  for (int64_t i = 0; i < src_bytes; ++i) src.get()[i] = static_cast<char>(i * 7);
  ESTUARY_ASSIGN_OR_RETURN(auto src_region, transport->RegisterRegion(src.get(), src_bytes));
  const absl::Duration wait = absl::Seconds(30);

  for (const int64_t m : o.message_bytes) {
    Row row;
    row.tls = t.name;
    row.message_bytes = m;
    // Bandwidth: puts cycling over every layer and page of the pool, one flush at the end.
    const int64_t slots = region_bytes / m;
    const int64_t src_slots = src_bytes / m;
    auto put_pass = [&](int64_t n) -> absl::Status {
      for (int64_t i = 0; i < n; ++i) {
        const int layer = static_cast<int>(i % o.n_layers);
        const int64_t off = ((i / o.n_layers) % slots) * m;
        ESTUARY_RETURN_IF_ERROR(ep->Put(src.get() + (i % src_slots) * m, m, *layers[layer], off,
                                        absl::Now() + wait));
      }
      return ep->Flush(absl::Now() + wait);
    };
    const int64_t total = tcp_only ? o.bandwidth_bytes_tcp : o.bandwidth_bytes;
    const int64_t n = std::max<int64_t>(16, total / m);
    ESTUARY_RETURN_IF_ERROR(put_pass(std::min<int64_t>(n, 32)));  // warm-up
    const absl::Time t0 = absl::Now();
    ESTUARY_RETURN_IF_ERROR(put_pass(n));
    row.gbytes_per_second = n * m / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9;
    // The same puts from one source to one destination (cache-hot, what ucx_perftest does).
    {
      const absl::Time h0 = absl::Now();
      for (int64_t i = 0; i < n; ++i) {
        ESTUARY_RETURN_IF_ERROR(ep->Put(src.get(), m, *layers[0], 0, absl::Now() + wait));
      }
      ESTUARY_RETURN_IF_ERROR(ep->Flush(absl::Now() + wait));
      row.hot_gbytes_per_second = n * m / absl::ToDoubleSeconds(absl::Now() - h0) / 1e9;
    }

    // Latency: requests of prompt_tokens tokens over every layer, completion, acknowledgement.
    const int64_t chunk = std::min(m, run);
    std::vector<double> ms;
    for (int r = 0; r < o.requests + 3; ++r) {
      const int first_page = (r * pages_per_request) % (o.pages_per_layer - pages_per_request + 1);
      const absl::Time start = absl::Now();
      for (int l = 0; l < o.n_layers; ++l) {
        for (int64_t off = 0; off < run; off += chunk) {
          ESTUARY_RETURN_IF_ERROR(ep->Put(src.get() + l * run + off, std::min(chunk, run - off),
                                          *layers[l], first_page * page + off,
                                          absl::Now() + wait));
        }
      }
      ESTUARY_RETURN_IF_ERROR(ep->Flush(absl::Now() + wait));
      estuary::v1::KvCompletion c;
      c.set_request_id(absl::StrCat("bench-", r));
      c.set_num_tokens(o.prompt_tokens);
      c.set_first_token(42);
      c.set_provenance(std::string(static_cast<size_t>(o.prompt_tokens), '\xff'));
      ESTUARY_RETURN_IF_ERROR(ep->SendMessage(c.SerializeAsString(), absl::Now() + wait));
      ESTUARY_ASSIGN_OR_RETURN(Message ack, transport->ReceiveFrom(*ep, absl::Now() + wait));
      if (ack.payload != "ack:" + c.request_id()) {
        return absl::InternalError("unexpected ack: " + ack.payload);
      }
      if (r >= 3) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    row.p50_ms = Percentile(ms, 0.5);
    row.p99_ms = Percentile(ms, 0.99);
    rows->push_back(row);
  }
  ESTUARY_RETURN_IF_ERROR(ep->SendMessage("done", absl::Now() + wait));
  ESTUARY_ASSIGN_OR_RETURN(std::string done, ReadFrame(fd, absl::Now() + kControlTimeout));
  if (done != "DONE") return absl::InternalError("receiver: " + done);
  ep.reset();
  src_region.reset();
  transport.reset();

  if (o.run_perftest) {
    for (Row& row : *rows) {
      if (row.tls != t.name) continue;
      const int64_t total = tcp_only ? o.bandwidth_bytes_tcp : o.bandwidth_bytes;
      const int iters = static_cast<int>(std::clamp<int64_t>(total / row.message_bytes, 16, 100000));
      absl::StatusOr<double> gbps = RunPerftest(o, t.perftest_tls, row.message_bytes, iters,
                                                (*port)++);
      if (gbps.ok()) {
        row.perftest_gbytes_per_second = *gbps;
      } else {
        ESTUARY_LOG(WARNING) << gbps.status();
      }
    }
  }
  return absl::OkStatus();
}

std::string HumanBytes(int64_t b) {
  if (b % (1 << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b % (1 << 10) == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

void Print(const BenchKvOptions& o, const std::vector<Row>& rows, std::ostream& out) {
  if (o.json) {
    nlohmann::ordered_json j;
    j["rows"] = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json row;
      row["tls"] = r.tls;
      row["message_bytes"] = r.message_bytes;
      row["gbytes_per_second"] = r.gbytes_per_second;
      row["hot_gbytes_per_second"] = r.hot_gbytes_per_second;
      row["p50_ms"] = r.p50_ms;
      row["p99_ms"] = r.p99_ms;
      if (r.perftest_gbytes_per_second >= 0) {
        row["perftest_gbytes_per_second"] = r.perftest_gbytes_per_second;
        row["ratio"] = r.gbytes_per_second / r.perftest_gbytes_per_second;
        row["hot_ratio"] = r.hot_gbytes_per_second / r.perftest_gbytes_per_second;
      } else {
        row["perftest_gbytes_per_second"] = nullptr;
      }
      j["rows"].push_back(row);
    }
    out << j.dump(2) << "\n";
    return;
  }
  out << absl::StrFormat("%-5s %9s %10s %9s %9s %7s %9s %9s %9s\n", "tls", "message",
                         "pool GB/s", "hot GB/s", "perftest", "ratio", "hot ratio", "p50 ms",
                         "p99 ms");
  for (const Row& r : rows) {
    const double pt = r.perftest_gbytes_per_second;
    auto ratio = [&](double x) { return pt > 0 ? absl::StrFormat("%.2f", x / pt) : "-"; };
    out << absl::StrFormat("%-5s %9s %10.3f %9.3f %9s %7s %9s %9.3f %9.3f\n", r.tls,
                           HumanBytes(r.message_bytes), r.gbytes_per_second,
                           r.hot_gbytes_per_second, pt > 0 ? absl::StrFormat("%.3f", pt) : "-",
                           ratio(r.gbytes_per_second), ratio(r.hot_gbytes_per_second), r.p50_ms,
                           r.p99_ms);
  }
  out << absl::StrFormat(
      "request = %d tokens x %d layers (%s per layer of a page), puts of min(message, %s), "
      "flush, completion, ack\n",
      o.prompt_tokens, o.n_layers, HumanBytes(PageLayerBytes(o)),
      HumanBytes((o.prompt_tokens + o.block_size - 1) / o.block_size * PageLayerBytes(o)));
}

}  // namespace

absl::Status ValidateBenchKvOptions(const BenchKvOptions& o) {
  if (o.transports.empty()) return absl::InvalidArgumentError("bench-kv: no transports");
  if (o.n_layers <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.block_size <= 0 ||
      o.prompt_tokens <= 0 || o.requests <= 0 || o.bandwidth_bytes <= 0 ||
      o.bandwidth_bytes_tcp <= 0) {
    return absl::InvalidArgumentError("bench-kv: every size and count must be positive");
  }
  const int pages_per_request = (o.prompt_tokens + o.block_size - 1) / o.block_size;
  if (o.pages_per_layer < pages_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("bench-kv: pages_per_layer ", o.pages_per_layer,
                                                   " < pages of one request ", pages_per_request));
  }
  for (int64_t m : o.message_bytes) {
    if (m <= 0 || m > o.pages_per_layer * PageLayerBytes(o)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bench-kv: message size ", m, " must be in (0, one layer of the pool]"));
    }
  }
  return absl::OkStatus();
}

absl::Status RunBenchKv(const BenchKvOptions& options, std::ostream& out) {
  ESTUARY_RETURN_IF_ERROR(ValidateBenchKvOptions(options));
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return absl::InternalError("socketpair");
  const pid_t child = fork();
  if (child < 0) return absl::InternalError("fork");
  if (child == 0) {
    close(sv[0]);
    ReceiverMain(sv[1], options);
    _exit(0);
  }
  close(sv[1]);
  const int fd = sv[0];
  std::vector<Row> rows;
  int port = options.perftest_port;
  absl::Status status;
  for (const BenchKvTransport& t : options.transports) {
    status = MeasureTransport(fd, options, t, &port, &rows);
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("bench-kv ", t.name, ": ", status.message()));
      break;
    }
  }
  (void)WriteFrame(fd, "EXIT");
  close(fd);
  int wstatus = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (waitpid(child, &wstatus, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &wstatus, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (!status.ok()) return status;
  Print(options, rows, out);
  return absl::OkStatus();
}

}  // namespace estuary::kvtransfer
