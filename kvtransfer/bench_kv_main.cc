// Standalone bench-kv (the `estuary bench-kv` subcommand runs the same RunBenchKv).
//   bench_kv [--json] [--quick] [--tls=tcp|sm] [--no-perftest] [--transport-memory]
//            [--receiver-spins]
#include <iostream>
#include <string>

#include "kvtransfer/bench_kv.h"

int main(int argc, char** argv) {
  estuary::kvtransfer::BenchKvOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      options.json = true;
    } else if (a == "--transport-memory") {
      options.receiver_transport_memory = true;
    } else if (a == "--receiver-spins") {
      options.receiver_busy_poll = true;
    } else if (a == "--no-perftest") {
      options.run_perftest = false;
    } else if (a == "--quick") {
      options.bandwidth_bytes = 64 << 20;
      options.bandwidth_bytes_tcp = 16 << 20;
      options.requests = 10;
    } else if (a.rfind("--tls=", 0) == 0) {
      const std::string name = a.substr(6);
      std::erase_if(options.transports, [&](const auto& t) { return t.name != name; });
    } else {
      std::cerr << "usage: bench_kv [--json] [--quick] [--tls=tcp|sm] [--no-perftest] "
                   "[--transport-memory] [--receiver-spins]\n";
      return 2;
    }
  }
  const absl::Status s = estuary::kvtransfer::RunBenchKv(options, std::cout);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
