// kv_peer: the far end of the multi-process UCX tests (ucx_transport_test.cc).
//
//   kv_peer <tls>[+split] <region_bytes>
// Prints "ADDR <hex>" and "REGION <base> <bytes> <hex rkey>" on stdout, reads "PEER <hex>" on
// stdin, connects back to that address, then answers messages until "quit":
//   "sum"      -> "sum <FNV-1a of the whole region>"
//   anything   -> echoed back.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/ucx_transport.h"

namespace estuary::kvtransfer {
namespace {

int Run(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: kv_peer <tls> <region_bytes>\n";
    return 2;
  }
  UcxTransportOptions options;
  options.tls = argv[1];  // "<UCX_TLS>[+split]" as in ucx_transport_test.cc
  if (const size_t plus = options.tls.find('+'); plus != std::string::npos) {
    options.tls.resize(plus);
    options.separate_data_endpoint = true;
  }
  auto transport = UcxTransport::Create(options);
  if (!transport.ok()) {
    std::cerr << transport.status() << "\n";
    return 1;
  }
  std::vector<uint8_t> memory(std::strtoull(argv[2], nullptr, 10), 0);
  auto region = (*transport)->RegisterRegion(memory.data(), memory.size());
  if (!region.ok()) {
    std::cerr << region.status() << "\n";
    return 1;
  }
  const RegionDescriptor d = (*region)->Describe();
  std::cout << "ADDR " << absl::BytesToHexString((*transport)->Address()) << "\n"
            << "REGION " << d.base << " " << d.bytes << " " << absl::BytesToHexString(d.rkey)
            << std::endl;
  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("PEER ", 0) != 0) return 1;
  auto ep = (*transport)->Connect(absl::HexStringToBytes(line.substr(5)),
                                  absl::Now() + absl::Seconds(10));
  if (!ep.ok()) {
    std::cerr << ep.status() << "\n";
    return 1;
  }
  while (true) {
    auto m = (*transport)->PollMessage(absl::Now() + absl::Seconds(60));
    if (!m.ok()) return 1;
    if (m->payload == "quit") return 0;
    std::string reply = m->payload;
    if (m->payload == "sum") reply = absl::StrCat("sum ", Transport::PeerId(std::string_view(
                                                              reinterpret_cast<char*>(memory.data()),
                                                              memory.size())));
    if (!(*ep)->SendMessage(reply, absl::Now() + absl::Seconds(5)).ok()) return 1;
  }
}

}  // namespace
}  // namespace estuary::kvtransfer

int main(int argc, char** argv) { return estuary::kvtransfer::Run(argc, argv); }
