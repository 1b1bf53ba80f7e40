// DecodeEngine's reservations: the decode side of a fenced KV push (decode_engine.h "Reserve";
// kvtransfer/README.md "Fencing").
//
// A reservation lives in `reservations_` (by request id) until its KV arrives (-> `completed_`,
// then the running batch), its writer gives up (-> `writer_ended_`), or its request ends first
// (Abort, lease). A request that ends while a writer is attached leaves its pages in `fenced_`
// (by epoch) until that writer's completion arrives or lease + grace passes; pages given back
// without the writer's word are remembered in `given_back_`, so that a writer that reports a late
// put afterwards gets the pages' new owners recomputed. Other threads (the KV receiver) only
// move entries between these containers under `reservations_mu_`; the engine thread ends
// requests and releases pages (DrainReservations).

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "decode/decode_engine.h"
#include "decode/engine_sequence.h"

namespace estuary {
namespace {

// How many reservations given back without their writer's word are remembered for late reports.
constexpr size_t kGivenBackMemory = 4096;

std::string Name(const std::string& request_id, uint64_t epoch) {
  return absl::StrCat("'", request_id, "' (epoch ", absl::Hex(epoch), ")");
}

}  // namespace

absl::StatusOr<DecodeEngine::Reservation> DecodeEngine::Reserve(DecodeRequest request,
                                                                 absl::Duration lease) {
  ESTUARY_RETURN_IF_ERROR(ValidateRequest(request));
  if (lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("lease must be positive");
  const std::string id = request.request_id;
  auto reserved = std::make_unique<Reserved>();
  reserved->sequence = NewSequence(std::move(request));
  Sequence& s = *reserved->sequence;
  ESTUARY_RETURN_IF_ERROR(inbox_.Claim(id));
  // Room for the prompt and the first generated token (pool calls are thread-safe).
  if (absl::Status status = s.kv.Reserve(s.PrefillTarget() + 1); !status.ok()) {
    inbox_.Forget(id);
    return status;
  }
  Reservation out{s.kv.pages(), absl::Now() + lease, 0};
  reserved->pages = out.pages;
  reserved->lease_deadline = out.lease_deadline;
  absl::MutexLock lock(&reservations_mu_);
  // Random, nonzero and unique among the live and fenced ones.
  do {
    out.epoch = epochs_();
  } while (out.epoch == 0 || fenced_.contains(out.epoch));
  reserved->epoch = out.epoch;
  reservations_[id] = std::move(reserved);
  return out;
}

absl::StatusOr<DecodeEngine::Reservation> DecodeEngine::FindReservation(
    const std::string& request_id, uint64_t epoch) const {
  absl::MutexLock lock(&reservations_mu_);
  auto it = reservations_.find(request_id);
  if (it == reservations_.end() || it->second->epoch != epoch) {
    return absl::NotFoundError(absl::StrCat("no live reservation ", Name(request_id, epoch),
                                            " (ended, aborted, or never made)"));
  }
  return Reservation{it->second->pages, it->second->lease_deadline, epoch};
}

absl::Status DecodeEngine::AttachWriter(const std::string& request_id, const Writer& writer) {
  absl::MutexLock lock(&reservations_mu_);
  auto it = reservations_.find(request_id);
  if (it == reservations_.end() || it->second->epoch != writer.epoch) {
    return absl::NotFoundError(absl::StrCat("no live reservation ", Name(request_id, writer.epoch),
                                            " (ended, aborted, or never made)"));
  }
  Reserved& r = *it->second;
  if (r.aborted) {
    return absl::FailedPreconditionError(
        absl::StrCat("reservation ", Name(request_id, writer.epoch), " was aborted"));
  }
  if (absl::Now() >= r.lease_deadline) {
    return absl::FailedPreconditionError(
        absl::StrCat("the lease of reservation ", Name(request_id, writer.epoch), " has ended"));
  }
  if (r.writer != 0 && r.writer != writer.id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "reservation ", Name(request_id, writer.epoch), " already has another writer"));
  }
  r.writer = writer.id;
  return absl::OkStatus();
}

absl::Status DecodeEngine::CompleteReservation(const std::string& request_id, const Writer& writer,
                                               int32_t first_token,
                                               absl::Span<const uint8_t> provenance,
                                               std::optional<TokenLogprobs> first_token_logprobs) {
  const LlamaConfig& config = runner_->config();
  const int32_t vocab = config.vocab_size;
  auto outside = [vocab](int32_t id) { return id < 0 || id >= vocab; };
  // What the writer sent, checked against this worker's own model and reservation.
  auto check = [&](const Sequence& s) -> absl::Status {
    if (outside(first_token)) {
      return absl::InvalidArgumentError(absl::StrCat("first token ", first_token,
                                                     " outside the vocabulary [0, ", vocab, ")"));
    }
    if (first_token_logprobs.has_value()) {
      if (first_token_logprobs->top.size() > static_cast<size_t>(kMaxLogprobs)) {
        return absl::InvalidArgumentError(absl::StrCat("first token log-probabilities name ",
                                                       first_token_logprobs->top.size(),
                                                       " tokens; at most ", kMaxLogprobs));
      }
      for (const TokenLogprob& t : first_token_logprobs->top) {
        if (outside(t.id)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "first token log-probabilities name token ", t.id, " outside the vocabulary"));
        }
      }
    }
    const int prompt = s.PrefillTarget();
    if (static_cast<int>(provenance.size()) != prompt) {
      return absl::InvalidArgumentError(absl::StrCat("provenance of ", provenance.size(),
                                                     " slots for a prompt of ", prompt));
    }
    for (size_t pos = 0; pos < provenance.size(); ++pos) {
      const uint8_t p = provenance[pos];
      if (p != kProvenanceFullDepth && p >= config.n_layers) {
        return absl::InvalidArgumentError(absl::StrCat("provenance ", int{p}, " at position ", pos,
                                                       " names no layer of ", config.n_layers));
      }
    }
    return absl::OkStatus();
  };

  absl::MutexLock lock(&reservations_mu_);
  auto it = reservations_.find(request_id);
  if (it == reservations_.end() || it->second->epoch != writer.epoch) {
    return WriterGoneLocked(request_id, writer);
  }
  Reserved& r = *it->second;
  if (r.writer == 0 || r.writer != writer.id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "completion for reservation ", Name(request_id, writer.epoch), " from writer ",
        absl::Hex(writer.id), ", which is not attached to it"));
  }
  // From here the writer is done with the pages (it flushed before sending).
  absl::Status checked = check(*r.sequence);
  if (checked.ok() && r.aborted) checked = absl::CancelledError(request_id);
  if (!checked.ok()) {
    r.end_status = checked;
    writer_ended_.push_back(std::move(it->second));
    reservations_.erase(it);
    return checked;
  }
  Sequence& s = *r.sequence;
  for (size_t pos = 0; pos < provenance.size(); ++pos) {
    s.kv.SetProvenance(static_cast<int>(pos), provenance[pos]);
  }
  r.first_token = SampledToken{first_token, std::move(first_token_logprobs)};
  completed_.push_back(std::move(it->second));
  reservations_.erase(it);
  return absl::OkStatus();
}

absl::Status DecodeEngine::EndReservation(const std::string& request_id, const Writer& writer,
                                          absl::Status writer_status) {
  if (writer_status.ok()) writer_status = absl::AbortedError("the writer aborted");
  absl::MutexLock lock(&reservations_mu_);
  auto it = reservations_.find(request_id);
  if (it == reservations_.end() || it->second->epoch != writer.epoch) {
    return WriterGoneLocked(request_id, writer);
  }
  if (it->second->writer == 0 || it->second->writer != writer.id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "abort of reservation ", Name(request_id, writer.epoch), " from writer ",
        absl::Hex(writer.id), ", which is not attached to it"));
  }
  it->second->end_status = absl::Status(
      writer_status.code(),
      absl::StrCat("the prefill worker ended request '", request_id, "': ", writer_status.message()));
  writer_ended_.push_back(std::move(it->second));
  reservations_.erase(it);
  return absl::OkStatus();
}

absl::Status DecodeEngine::WriterGoneLocked(const std::string& request_id, const Writer& writer) {
  const std::string name = Name(request_id, writer.epoch);
  if (auto f = fenced_.find(writer.epoch); f != fenced_.end()) {
    Fenced& fenced = *f->second;
    if (fenced.writer == writer.id && fenced.sequence->request.request_id == request_id) {
      fenced.confirmed = true;  // the engine thread gives the pages back
      return absl::NotFoundError(absl::StrCat(
          "reservation ", name, " ended before its writer finished; its pages go back now"));
    }
  }
  if (writer.late_put) {
    for (const auto& [epoch, pages] : given_back_) {
      if (epoch != writer.epoch) continue;
      // A writer that stalled past its stop wrote into pages already given back: whoever holds
      // them now must not trust their KV.
      ++stale_writer_reports_;
      const absl::flat_hash_set<int32_t> touched(pages.begin(), pages.end());
      auto holds = [&touched](const Sequence& s) {
        return std::any_of(s.kv.pages().begin(), s.kv.pages().end(),
                           [&touched](int32_t p) { return touched.contains(p); });
      };
      for (auto& [id, r] : reservations_) r->tainted |= holds(*r->sequence);
      for (auto& r : completed_) r->tainted |= holds(*r->sequence);
      tainted_pages_.insert(tainted_pages_.end(), pages.begin(), pages.end());
      ESTUARY_LOG(WARNING) << "a writer reported a late put into reservation " << name
                           << ", whose " << pages.size()
                           << " pages were given back: their holders recompute";
      break;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no live reservation ", name, " (ended, aborted, or never made); ignored"));
}

int DecodeEngine::reserved() const {
  absl::MutexLock lock(&reservations_mu_);
  return static_cast<int>(reservations_.size());
}

int DecodeEngine::fenced() const {
  absl::MutexLock lock(&reservations_mu_);
  return static_cast<int>(fenced_.size());
}

int64_t DecodeEngine::stale_writer_reports() const {
  absl::MutexLock lock(&reservations_mu_);
  return stale_writer_reports_;
}

void DecodeEngine::EndReserved(std::unique_ptr<Reserved> r, FinishReason reason,
                               absl::Status status) {
  Sequence& s = *r->sequence;
  if (r->writer == 0) {  // nobody may write: refused from now on (the reservation is gone)
    Finish(s, reason, std::move(status));
    return;
  }
  Finish(s, reason, std::move(status), /*release_pages=*/false);
  auto fenced = std::make_unique<Fenced>();
  fenced->writer = r->writer;
  fenced->release_at = r->lease_deadline + options_.lease_grace;
  fenced->sequence = std::move(r->sequence);
  absl::MutexLock lock(&reservations_mu_);
  fenced_.emplace(r->epoch, std::move(fenced));
}

void DecodeEngine::AbortReservations(const std::vector<std::string>& aborts) {
  std::vector<std::unique_ptr<Reserved>> live, arrived;
  {
    absl::MutexLock lock(&reservations_mu_);
    for (const std::string& id : aborts) {
      if (auto it = reservations_.find(id); it != reservations_.end()) {
        live.push_back(std::move(it->second));
        reservations_.erase(it);
      }
      for (std::unique_ptr<Reserved>& r : completed_) {
        if (r != nullptr && r->sequence->request.request_id == id) arrived.push_back(std::move(r));
      }
    }
    completed_.erase(std::remove(completed_.begin(), completed_.end(), nullptr), completed_.end());
  }
  for (std::unique_ptr<Reserved>& r : live) {
    const std::string id = r->sequence->request.request_id;
    EndReserved(std::move(r), FinishReason::kCancelled, absl::CancelledError(id));
  }
  for (std::unique_ptr<Reserved>& r : arrived) {  // the writer is done: the pages return
    Finish(*r->sequence, FinishReason::kCancelled,
           absl::CancelledError(r->sequence->request.request_id));
  }
}

void DecodeEngine::DrainReservations() {
  std::vector<std::unique_ptr<Reserved>> completed, ended, expired;
  std::vector<std::unique_ptr<Fenced>> released;
  std::vector<int32_t> tainted;
  {
    absl::MutexLock lock(&reservations_mu_);
    completed.swap(completed_);
    ended.swap(writer_ended_);
    tainted.swap(tainted_pages_);
    const absl::Time now = absl::Now();
    for (auto it = reservations_.begin(); it != reservations_.end();) {
      if (it->second->lease_deadline <= now) {
        expired.push_back(std::move(it->second));
        reservations_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto it = fenced_.begin(); it != fenced_.end();) {
      Fenced& f = *it->second;
      if (!f.confirmed && f.release_at > now) {
        ++it;
        continue;
      }
      if (!f.confirmed) {  // given back without the writer's word: remember for a late report
        given_back_.emplace_back(it->first, f.sequence->kv.pages());
        if (given_back_.size() > kGivenBackMemory) given_back_.pop_front();
        ESTUARY_LOG(WARNING) << "reservation " << Name(f.sequence->request.request_id, it->first)
                             << ": no word from its writer by lease + "
                             << absl::FormatDuration(options_.lease_grace)
                             << "; its pages go back to the pool";
      }
      released.push_back(std::move(it->second));
      fenced_.erase(it++);
    }
  }
  for (std::unique_ptr<Fenced>& f : released) f->sequence->kv.Release();
  for (std::unique_ptr<Reserved>& r : ended) {
    Finish(*r->sequence, FinishReason::kError, r->end_status);
  }
  for (std::unique_ptr<Reserved>& r : expired) {
    const std::string id = r->sequence->request.request_id;
    EndReserved(std::move(r), FinishReason::kError,
                absl::DeadlineExceededError(absl::StrCat(
                    "the KV of request '", id, "' did not arrive before its lease ended")));
  }
  if (!tainted.empty()) RecomputeTainted(tainted);
  for (std::unique_ptr<Reserved>& r : completed) {
    Sequence& s = *r->sequence;
    if (r->tainted) {
      // Its pages may hold a stale writer's bytes: prefill the prompt here instead (the
      // writer's first token is dropped; sampling gives the same one for greedy requests).
      s.kv.Release();
      waiting_.push_back(std::move(r->sequence));
      continue;
    }
    s.kv.set_length(s.PrefillTarget());
    // The pushed prompt joins the prefix cache: later samples of it adopt its full pages.
    if (options_.enable_prefix_caching) s.kv.RegisterFullPages(s.tokens);
    running_.push_back(std::move(r->sequence));
    EmitToken(s, std::move(r->first_token), runner_->config().n_layers);
  }
}

void DecodeEngine::RecomputeTainted(absl::Span<const int32_t> pages) {
  const absl::flat_hash_set<int32_t> touched(pages.begin(), pages.end());
  // Tainted pages may sit in the prefix cache: forget it all (rare; it refills).
  pool_->ClearPrefixCache();
  for (auto& s : running_) {
    if (s->finished || s->preempted) continue;
    const bool holds = std::any_of(s->kv.pages().begin(), s->kv.pages().end(),
                                   [&touched](int32_t p) { return touched.contains(p); });
    if (holds) Preempt(*s);  // recomputed from its tokens; nothing the client saw changes
  }
}

}  // namespace estuary
