#include "kvtransfer/nccl_transport_fake.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"

namespace estuary::kvtransfer::nccl {
namespace {

struct Op {
  const char* src = nullptr;  // send
  char* dst = nullptr;        // recv
  size_t bytes = 0;
  uint64_t index = 0;  // 1-based, per rank, in enqueue order
};

// One 2-rank group. Rank r's sends meet rank 1-r's receives in order.
struct Group {
  absl::Mutex mu;
  bool joined[2] ABSL_GUARDED_BY(mu) = {false, false};
  bool aborted[2] ABSL_GUARDED_BY(mu) = {false, false};
  absl::Status error ABSL_GUARDED_BY(mu);  // fails both ranks (a size mismatch)
  std::deque<Op> sends[2] ABSL_GUARDED_BY(mu);
  std::deque<Op> recvs[2] ABSL_GUARDED_BY(mu);
  uint64_t enqueued[2] ABSL_GUARDED_BY(mu) = {0, 0};
  uint64_t completed[2] ABSL_GUARDED_BY(mu) = {0, 0};  // ops 1..completed[r] are done
  std::set<uint64_t> done_beyond[2] ABSL_GUARDED_BY(mu);

  void Complete(int rank, uint64_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    done_beyond[rank].insert(index);
    while (!done_beyond[rank].empty() && *done_beyond[rank].begin() == completed[rank] + 1) {
      done_beyond[rank].erase(done_beyond[rank].begin());
      ++completed[rank];
    }
  }

  // Matches rank `from`'s sends with rank 1 - from's receives.
  void Match(int from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int to = 1 - from;
    while (error.ok() && !sends[from].empty() && !recvs[to].empty()) {
      const Op s = sends[from].front();
      const Op r = recvs[to].front();
      if (s.bytes != r.bytes) {
        error = absl::InternalError(absl::StrCat("fake NCCL: a send of ", s.bytes,
                                                 " bytes met a receive of ", r.bytes, " bytes"));
        return;
      }
      if (s.bytes > 0) std::memcpy(r.dst, s.src, s.bytes);
      sends[from].pop_front();
      recvs[to].pop_front();
      Complete(from, s.index);
      Complete(to, r.index);
    }
  }
};

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::weak_ptr<Group>> groups ABSL_GUARDED_BY(mu);
};

Registry& GlobalRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

struct FakeNcclBackend::Shared {
  absl::Mutex mu;
  std::vector<std::pair<const char*, size_t>> host_ranges ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<size_t, absl::Status> link_errors ABSL_GUARDED_BY(mu);
  bool join_hangs ABSL_GUARDED_BY(mu) = false;
  size_t started ABSL_GUARDED_BY(mu) = 0;
  std::atomic<size_t> aborted{0};
  std::atomic<size_t> closed{0};

  absl::Status LinkError(size_t index) {
    absl::MutexLock lock(&mu);
    auto it = link_errors.find(index);
    return it == link_errors.end() ? absl::OkStatus() : it->second;
  }
};

namespace {

class FakeLink : public Link {
 public:
  FakeLink(std::shared_ptr<FakeNcclBackend::Shared> shared, std::shared_ptr<Group> group, int rank,
           size_t index, bool hangs)
      : shared_(std::move(shared)),
        group_(std::move(group)),
        rank_(rank),
        index_(index),
        hangs_(hangs) {}
  ~FakeLink() override {
    if (!ended_) Abort();
  }

  absl::StatusOr<bool> InProgress() override {
    ESTUARY_RETURN_IF_ERROR(Check());
    absl::MutexLock lock(&group_->mu);
    return hangs_ || !group_->joined[0] || !group_->joined[1];
  }

  absl::Status Send(const void* data, size_t bytes) override {
    ESTUARY_RETURN_IF_ERROR(Check());
    absl::MutexLock lock(&group_->mu);
    group_->sends[rank_].push_back(
        Op{static_cast<const char*>(data), nullptr, bytes, ++group_->enqueued[rank_]});
    group_->Match(rank_);
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, size_t bytes) override {
    ESTUARY_RETURN_IF_ERROR(Check());
    absl::MutexLock lock(&group_->mu);
    group_->recvs[rank_].push_back(
        Op{nullptr, static_cast<char*>(data), bytes, ++group_->enqueued[rank_]});
    group_->Match(1 - rank_);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Mark() override {
    ESTUARY_RETURN_IF_ERROR(Check());
    absl::MutexLock lock(&group_->mu);
    return group_->enqueued[rank_];
  }

  absl::StatusOr<bool> Done(uint64_t token) override {
    ESTUARY_RETURN_IF_ERROR(Check());
    absl::MutexLock lock(&group_->mu);
    return group_->completed[rank_] >= token;
  }

  void Abort() override {
    if (ended_) return;
    ended_ = true;
    shared_->aborted.fetch_add(1);
    absl::MutexLock lock(&group_->mu);
    group_->aborted[rank_] = true;
    group_->sends[rank_].clear();
    group_->recvs[rank_].clear();
  }

  void Close(absl::Time deadline) override {
    if (ended_) return;
    ended_ = true;
    shared_->closed.fetch_add(1);
  }

 private:
  absl::Status Check() {
    if (ended_) return absl::FailedPreconditionError("fake NCCL link was closed or aborted");
    if (absl::Status e = shared_->LinkError(index_); !e.ok()) return e;
    absl::MutexLock lock(&group_->mu);
    return group_->error;
  }

  const std::shared_ptr<FakeNcclBackend::Shared> shared_;
  const std::shared_ptr<Group> group_;
  const int rank_;
  const size_t index_;
  const bool hangs_;
  bool ended_ = false;
};

}  // namespace

FakeNcclBackend::FakeNcclBackend() : shared_(std::make_shared<Shared>()) {}
FakeNcclBackend::~FakeNcclBackend() = default;

void FakeNcclBackend::MarkHostMemory(const void* data, size_t bytes) {
  absl::MutexLock lock(&shared_->mu);
  shared_->host_ranges.emplace_back(static_cast<const char*>(data), bytes);
}

void FakeNcclBackend::InjectLinkError(size_t index, absl::Status error) {
  absl::MutexLock lock(&shared_->mu);
  shared_->link_errors[index] = std::move(error);
}

void FakeNcclBackend::SetJoinHangs(bool hangs) {
  absl::MutexLock lock(&shared_->mu);
  shared_->join_hangs = hangs;
}

size_t FakeNcclBackend::links_started() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->started;
}
size_t FakeNcclBackend::links_aborted() const { return shared_->aborted.load(); }
size_t FakeNcclBackend::links_closed() const { return shared_->closed.load(); }

absl::Status FakeNcclBackend::CheckMemory(const void* data, size_t bytes, std::string_view what) {
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is a null pointer"));
  }
  const char* p = static_cast<const char*>(data);
  absl::MutexLock lock(&shared_->mu);
  for (const auto& [base, n] : shared_->host_ranges) {
    if (p < base + n && base < p + bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s at %p (%u bytes) is host memory; the NCCL transport moves CUDA device memory only",
          std::string(what), data, bytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> FakeNcclBackend::Allocate(size_t bytes) {
  void* p = std::calloc(1, bytes);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("calloc ", bytes));
  return p;
}

void FakeNcclBackend::Free(void* data) { std::free(data); }

absl::StatusOr<std::string> FakeNcclBackend::NewGroupId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return absl::StrCat("fake-nccl-group-", rd(), "-", counter.fetch_add(1));
}

absl::StatusOr<std::unique_ptr<Link>> FakeNcclBackend::StartLink(std::string_view group_id,
                                                                 int rank) {
  if (rank != 0 && rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat("fake NCCL link rank ", rank));
  }
  std::shared_ptr<Group> group;
  {
    Registry& r = GlobalRegistry();
    absl::MutexLock lock(&r.mu);
    if (r.groups.size() > 1024) {
      absl::erase_if(r.groups, [](const auto& g) { return g.second.expired(); });
    }
    std::weak_ptr<Group>& slot = r.groups[std::string(group_id)];
    group = slot.lock();
    if (group == nullptr) {
      group = std::make_shared<Group>();
      slot = group;
    }
  }
  {
    absl::MutexLock lock(&group->mu);
    if (group->joined[rank]) {
      return absl::InternalError(absl::StrCat("fake NCCL: rank ", rank, " joined twice"));
    }
    group->joined[rank] = true;
  }
  absl::MutexLock lock(&shared_->mu);
  const size_t index = shared_->started++;
  return std::unique_ptr<Link>(
      new FakeLink(shared_, std::move(group), rank, index, shared_->join_hangs));
}

}  // namespace estuary::kvtransfer::nccl
