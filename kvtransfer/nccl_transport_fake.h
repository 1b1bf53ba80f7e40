#pragma once
// FakeNcclBackend: an NcclTransport backend (nccl_transport_backend.h) without a GPU, so that the
// transport's protocol runs in CPU tests. "Device memory" is host memory; links of one group meet
// through a process-wide registry keyed by the group id, and a Send is matched with the other
// rank's Recv in order, copying the bytes when both are posted (like NCCL, a send does not
// complete before its receive is posted). A size mismatch fails both links.
//
// Fault hooks: host ranges that CheckMemory refuses (as the CUDA backend refuses host memory), an
// injected asynchronous error on one link, and a flag that keeps links from ever finishing their
// set-up (a peer that never joins).
//
// Thread-safety: all methods may be called from any thread; each Link from one thread at a time.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/nccl_transport_backend.h"

namespace estuary::kvtransfer::nccl {

class FakeNcclBackend : public Backend {
 public:
  // State shared by the backend and its links (nccl_transport_fake.cc).
  struct Shared;

  FakeNcclBackend();
  ~FakeNcclBackend() override;

  // CheckMemory refuses [data, data + bytes) from now on, like host memory on a GPU backend.
  void MarkHostMemory(const void* data, size_t bytes);
  // The link started `index`-th (0-based, in StartLink order) reports `error` from now on, as an
  // NCCL asynchronous error would be.
  void InjectLinkError(size_t index, absl::Status error);
  // Links started later never finish joining their group (InProgress stays true).
  void SetJoinHangs(bool hangs);
  // Links started / aborted / closed in order so far.
  size_t links_started() const;
  size_t links_aborted() const;
  size_t links_closed() const;

  std::string Describe() const override { return "fake NCCL backend (host memory)"; }
  absl::Status CheckMemory(const void* data, size_t bytes, std::string_view what) override;
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  absl::StatusOr<std::string> NewGroupId() override;
  absl::StatusOr<std::unique_ptr<Link>> StartLink(std::string_view group_id, int rank) override;

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace estuary::kvtransfer::nccl
