// NcclTransport over the real CUDA + NCCL backend (label gpu; built with ESTUARY_CUDA).
//
// What runs where:
//   - no GPU: the argument checks and CheckCudaDeviceMemory (host memory is refused without a
//     device) pass; the rest skip.
//   - one GPU: regions (device memory accepted, host memory refused, AllocateRegion zeroed), and a
//     Connect between two transports on the same device, which NCCL refuses (two ranks of one
//     communicator on one GPU): it must fail cleanly, not hang. Transfer tests skip.
//   - two or more GPUs: the transfer tests, one transport on device 0 and one on device 1 in this
//     process, with in-process and UCX-over-tcp control transports.
// NCCL refuses two ranks on one GPU, so the transfer tests need at least 2 devices; they skip
// with a message otherwise. The protocol itself is tested on CPU in nccl_transport_protocol_test.
#include "kvtransfer/nccl_transport.h"

#include <cuda_runtime.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transport_test_util.h"
#include "kvtransfer/ucx_transport.h"

namespace estuary::kvtransfer {
namespace {

using testing::In;
using testing::Pattern;

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define SKIP_UNLESS_GPUS(n)                                                                  \
  do {                                                                                       \
    const int have = DeviceCount();                                                          \
    if (have < (n)) {                                                                        \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have                   \
                   << ((n) >= 2 ? " (NCCL refuses two ranks of one communicator on one GPU)" \
                                : "");                                                       \
    }                                                                                        \
  } while (0)

// Device memory freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
  }
  ~DeviceBuffer() {
    (void)cudaSetDevice(device_);
    (void)cudaFree(data_);
  }
  char* data() const { return static_cast<char*>(data_); }
  size_t bytes() const { return bytes_; }
  void Fill(const std::vector<uint8_t>& host, size_t offset = 0) {
    ASSERT_EQ(cudaMemcpy(data() + offset, host.data(), host.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<uint8_t> Read(size_t offset, size_t n) const {
    return ReadDevice(data() + offset, n);
  }
  static std::vector<uint8_t> ReadDevice(const void* p, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  const int device_;
  const size_t bytes_;
  void* data_ = nullptr;
};

std::unique_ptr<Transport> MakeControl(const std::string& kind) {
  if (kind == "ucx-tcp") {
    UcxTransportOptions options;
    options.tls = "tcp";
    auto t = UcxTransport::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::unique_ptr<Transport>(std::move(*t)) : nullptr;
  }
  return InProcessTransport::Create();
}

std::unique_ptr<NcclTransport> MakeNccl(int device, const std::string& control = "inproc") {
  NcclTransportOptions options;
  options.device = device;
  auto t = NcclTransport::Create(MakeControl(control), options);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// ---- no device needed ----

TEST(NcclTransportTest, CreateRejectsBadArguments) {
  EXPECT_EQ(NcclTransport::Create(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  NcclTransportOptions negative;
  negative.device = -1;
  EXPECT_EQ(NcclTransport::Create(InProcessTransport::Create(), negative).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclTransportOptions missing;
  missing.device = 4096;
  const absl::StatusCode code =
      NcclTransport::Create(InProcessTransport::Create(), missing).status().code();
  // No such device: INVALID_ARGUMENT with devices, FAILED_PRECONDITION without any.
  EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
              code == absl::StatusCode::kFailedPrecondition)
      << absl::StatusCodeToString(code);
}

TEST(NcclTransportTest, CreateFailsCleanlyWithoutAGpu) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto t = NcclTransport::Create(InProcessTransport::Create(), {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_NE(t.status().message().find("CUDA"), absl::string_view::npos) << t.status();
  std::cerr << "without a GPU: " << t.status() << "\n";
}

TEST(NcclTransportTest, HostMemoryIsNotDeviceMemory) {
  std::vector<uint8_t> host(4096);
  absl::Status s = nccl::CheckCudaDeviceMemory(host.data(), host.size(), 0, "put source");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("put source"), absl::string_view::npos) << s;
  std::cerr << "host memory: " << s << "\n";
  EXPECT_EQ(nccl::CheckCudaDeviceMemory(nullptr, 16, 0, "region").code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- one device ----

TEST(NcclTransportTest, RegionsAreDeviceMemory) {
  SKIP_UNLESS_GPUS(1);
  auto t = MakeNccl(0);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), "nccl");
  std::vector<uint8_t> host(4096);
  auto refused = t->RegisterRegion(host.data(), host.size());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();

  DeviceBuffer buffer(0, 1 << 20);
  auto region = t->RegisterRegion(buffer.data(), buffer.bytes());
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->data(), buffer.data());
  EXPECT_TRUE(nccl::CheckCudaDeviceMemory(buffer.data(), buffer.bytes(), 0, "region").ok());

  auto allocated = t->AllocateRegion(300 << 10);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  const std::vector<uint8_t> zeros(300 << 10, 0);
  EXPECT_EQ(DeviceBuffer::ReadDevice((*allocated)->data(), zeros.size()), zeros);
  EXPECT_TRUE(
      nccl::CheckCudaDeviceMemory((*allocated)->data(), (*allocated)->bytes(), 0, "r").ok());
}

// Two ranks on one GPU: NCCL refuses the communicator. Connect must fail (not hang), and both ends
// must clean up.
TEST(NcclTransportTest, SameGpuConnectFailsCleanly) {
  SKIP_UNLESS_GPUS(1);
  auto a = MakeNccl(0);
  auto b = MakeNccl(0);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const absl::Time start = absl::Now();
  auto ep = a->Connect(b->Address(), In(absl::Seconds(60)));
  EXPECT_FALSE(ep.ok());
  std::cerr << "same-GPU connect: " << ep.status() << " after " << absl::Now() - start << "\n";
  EXPECT_LT(absl::Now() - start, absl::Seconds(61));
}

// ---- two devices ----

class NcclTransportPairTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclTransportPairTest, PutsLandByteExact) {
  SKIP_UNLESS_GPUS(2);
  auto sender = MakeNccl(0, GetParam());
  auto receiver = MakeNccl(1, GetParam());
  ASSERT_TRUE(sender != nullptr && receiver != nullptr);

  DeviceBuffer pool(1, 1 << 20);
  pool.Fill(std::vector<uint8_t>(1 << 20, 0x11));
  auto registered = receiver->RegisterRegion(pool.data(), pool.bytes());
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto allocated = receiver->AllocateRegion(256 << 10);
  ASSERT_TRUE(allocated.ok()) << allocated.status();

  const std::vector<uint8_t> a = Pattern(64 << 10, 3);
  const std::vector<uint8_t> b = Pattern(300 << 10, 7);
  const std::vector<uint8_t> c = Pattern(100, 9);
  DeviceBuffer src(0, a.size() + b.size() + c.size());
  src.Fill(a, 0);
  src.Fill(b, a.size());
  src.Fill(c, a.size() + b.size());

  auto ep = sender->Connect(receiver->Address(), In(absl::Seconds(60)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*registered)->Describe());
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto dst2 = (*ep)->ImportRegion((*allocated)->Describe());
  ASSERT_TRUE(dst2.ok()) << dst2.status();

  ASSERT_TRUE((*ep)->Put(src.data(), a.size(), **dst, 0, In(absl::Seconds(30))).ok());
  ASSERT_TRUE(
      (*ep)->Put(src.data() + a.size(), b.size(), **dst, 512 << 10, In(absl::Seconds(30))).ok());
  ASSERT_TRUE(
      (*ep)
          ->Put(src.data() + a.size() + b.size(), c.size(), **dst2, 1000, In(absl::Seconds(30)))
          .ok());
  absl::Status flush = (*ep)->Flush(In(absl::Seconds(30)));
  ASSERT_TRUE(flush.ok()) << flush;
  EXPECT_EQ(pool.Read(0, a.size()), a);
  EXPECT_EQ(pool.Read(512 << 10, b.size()), b);
  EXPECT_EQ(pool.Read(a.size(), 1)[0], 0x11);
  EXPECT_EQ(pool.Read((512 << 10) - 1, 1)[0], 0x11);
  EXPECT_EQ(pool.Read((512 << 10) + b.size(), 1)[0], 0x11);
  const char* al = static_cast<const char*>((*allocated)->data());
  EXPECT_EQ(DeviceBuffer::ReadDevice(al + 1000, c.size()), c);
  EXPECT_EQ(DeviceBuffer::ReadDevice(al + 999, 1)[0], 0);

  // Refused before anything moves: out of bounds, host memory, the other device's memory.
  EXPECT_EQ((*ep)->Put(src.data(), a.size(), **dst, pool.bytes() - 10, In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ep)->Put(a.data(), a.size(), **dst, 0, In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ep)->Put(pool.data(), 16, **dst, 0, In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*ep)->Health().ok());

  // Many puts between flushes (more than max_outstanding_puts).
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE((*ep)->Put(src.data() + i, 256, **dst, i * 256, In(absl::Seconds(30))).ok());
  }
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(30))).ok());
  const std::vector<uint8_t> host_src = src.Read(0, 1000 + 256);
  const std::vector<uint8_t> landed = pool.Read(999 * 256, 256);
  EXPECT_EQ(landed, std::vector<uint8_t>(host_src.begin() + 999, host_src.begin() + 999 + 256));
  ep->reset();
}

TEST_P(NcclTransportPairTest, MessagesArrive) {
  SKIP_UNLESS_GPUS(2);
  auto a = MakeNccl(0, GetParam());
  auto b = MakeNccl(1, GetParam());
  ASSERT_TRUE(a != nullptr && b != nullptr);
  testing::CheckMessagesArrive(*a, *b);
}

TEST_P(NcclTransportPairTest, WaitsHonourDeadlines) {
  SKIP_UNLESS_GPUS(2);
  auto a = MakeNccl(0, GetParam());
  auto b = MakeNccl(1, GetParam());
  ASSERT_TRUE(a != nullptr && b != nullptr);
  testing::CheckWaitsHonourDeadlines(*a, *b);
}

TEST_P(NcclTransportPairTest, DeadReceiverIsUnavailable) {
  SKIP_UNLESS_GPUS(2);
  auto sender = MakeNccl(0, GetParam());
  auto receiver = MakeNccl(1, GetParam());
  ASSERT_TRUE(sender != nullptr && receiver != nullptr);
  auto region = receiver->AllocateRegion(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  DeviceBuffer src(0, 1 << 20);
  auto ep = sender->Connect(receiver->Address(), In(absl::Seconds(60)));
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto dst = (*ep)->ImportRegion((*region)->Describe());
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE((*ep)->Put(src.data(), 1 << 20, **dst, 0, In(absl::Seconds(30))).ok());
  ASSERT_TRUE((*ep)->Flush(In(absl::Seconds(30))).ok());
  region->reset();
  receiver.reset();
  const absl::Time start = absl::Now();
  absl::Status put = (*ep)->Put(src.data(), 1 << 20, **dst, 0, In(absl::Seconds(30)));
  absl::Status flush = (*ep)->Flush(In(absl::Seconds(30)));
  EXPECT_FALSE(put.ok() && flush.ok());
  EXPECT_EQ((*ep)->Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

INSTANTIATE_TEST_SUITE_P(Controls, NcclTransportPairTest, ::testing::Values("inproc", "ucx-tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "inproc" ? std::string("InProcess")
                                                         : std::string("UcxTcp");
                         });

}  // namespace
}  // namespace estuary::kvtransfer
