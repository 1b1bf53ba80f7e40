#pragma once
// bench-kv: KV transfer throughput and per-request latency over UCX between two processes, next
// to ucx_perftest (ucp_put_bw) on the same machine and transports (kvtransfer/README.md).
//
// RunBenchKv forks a receiver child (the decode side: it registers a paged KV pool, answers
// completions) before it creates any UCX object, so call it from a process that has not started
// threads yet (e.g. first thing in a subcommand). The parent is the prefill side: for every
// transport setting and message size it measures
//   - GB/s of one-sided puts of `message_bytes` into the pool, plus the final flush;
//   - per-request latency: one request = the pages of `prompt_tokens` tokens for every layer,
//     pushed as puts of min(message_bytes, one layer's run of pages), a flush, one KvCompletion
//     message, and the receiver's acknowledgement (a full round trip);
//   - ucx_perftest -t ucp_put_bw with the same message size (server and client on 127.0.0.1).

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace estuary::kvtransfer {

struct BenchKvTransport {
  std::string name;           // row label, e.g. "tcp" or "sm"
  std::string tls;            // UCX_TLS for our transport
  bool separate_data_endpoint = false;  // see UcxTransportOptions
  std::string perftest_tls;   // UCX_TLS for ucx_perftest
};

struct BenchKvOptions {
  std::vector<BenchKvTransport> transports = {
      {"tcp", "tcp", false, "tcp"},
      {"sm", "sm,tcp", true, "sm"},  // shared-memory RMA (cma/posix); messages over tcp
  };
  std::vector<int64_t> message_bytes = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
  // Page shape (llama-3.2-1b): one layer of one page = 2 * 8 * 16 * 64 * 4 = 64 KiB.
  int n_layers = 16;
  int n_kv_heads = 8;
  int head_dim = 64;
  int block_size = 16;
  int pages_per_layer = 128;  // receiver pool: 16 layers x 128 pages x 64 KiB = 128 MiB
  int prompt_tokens = 128;    // tokens per request (8 pages)
  int requests = 40;          // latency samples per row (plus 3 warm-up)
  int64_t bandwidth_bytes = int64_t{512} << 20;  // bytes put per bandwidth measurement
  int64_t bandwidth_bytes_tcp = int64_t{128} << 20;  // ... for rows whose tls is plain tcp
  bool run_perftest = true;
  std::string perftest_path = "/usr/bin/ucx_perftest";
  int perftest_port = 13470;  // base; each run uses the next port
  // The receiver's progress thread spins (as perftest's server) instead of sleeping on the event
  // fd. Off by default: on a 2-core machine the spinning thread starves the other three.
  bool receiver_busy_poll = false;
  // The receiver's pool comes from Transport::AllocateRegion (UCX-allocated, shareable) instead of
  // malloc'ed memory registered with RegisterRegion.
  bool receiver_transport_memory = false;
  bool json = false;               // print {"rows": [...]} instead of the table
};

absl::Status ValidateBenchKvOptions(const BenchKvOptions& options);

// Runs the benchmark and prints the table (or JSON) to `out`.
absl::Status RunBenchKv(const BenchKvOptions& options, std::ostream& out);

}  // namespace estuary::kvtransfer
