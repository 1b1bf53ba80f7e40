#include "kvtransfer/descriptor_check.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "kvtransfer/fingerprint.h"
#include "kvtransfer/reshard.h"

namespace estuary::kvtransfer {

absl::Status CheckTransferDescriptor(const estuary::v1::TransferDescriptor& descriptor,
                                     const estuary::v1::KvFormatFingerprint& local_fingerprint,
                                     std::string_view transport_kind, int num_prompt_tokens) {
  ESTUARY_RETURN_IF_ERROR(CheckFingerprintsMatch(local_fingerprint, descriptor.fingerprint()));
  const estuary::v1::KvLayoutSpec& local = local_fingerprint.layout();  // the whole model's
  const int total_heads = local.n_kv_heads();
  const std::string& id = descriptor.request_id();
  auto bad = [&id](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("transfer descriptor for '", id, "': ", parts...));
  };
  if (descriptor.transport() != transport_kind) {
    return bad("transport '", descriptor.transport(), "' but this worker uses '",
               std::string(transport_kind), "'");
  }
  if (descriptor.worker_address().empty()) return bad("empty worker_address");
  if (descriptor.worker_address().size() > kMaxDescriptorAddressBytes) {
    return bad("worker_address of ", descriptor.worker_address().size(), " bytes (at most ",
               kMaxDescriptorAddressBytes, ")");
  }
  if (descriptor.reservation_epoch() == 0) return bad("no reservation_epoch");
  if (descriptor.lease_deadline_unix_ms() <= 0) return bad("no lease_deadline_unix_ms");
  const int dst_tp = descriptor.tp_size();
  const estuary::v1::KvLayoutSpec& dl = descriptor.layout();
  // In 64 bits: a hostile n_kv_heads times tp_size overflows an int (fuzz seed
  // kv_control/descriptor_overflowing_heads).
  if (dst_tp <= 0 || total_heads % dst_tp != 0 ||
      int64_t{dl.n_kv_heads()} * dst_tp != total_heads) {
    return bad("layout.n_kv_heads=", dl.n_kv_heads(), " with tp_size=", dst_tp,
               " does not split the model's ", total_heads, " KV heads");
  }
  if (dl.n_layers() != local.n_layers()) {
    return bad("layout.n_layers=", dl.n_layers(), " but the model has ", local.n_layers());
  }
  if (dl.head_dim() != local.head_dim()) {
    return bad("layout.head_dim=", dl.head_dim(), " but the model has ", local.head_dim());
  }
  if (dl.block_size() != local.block_size()) {
    return bad("layout.block_size=", dl.block_size(), " but the local block size is ",
               local.block_size());
  }
  if (!dl.dtype().empty() && dl.dtype() != local_fingerprint.dtype()) {
    return bad("layout.dtype=", dl.dtype(), " but the local dtype is ", local_fingerprint.dtype());
  }
  if (num_prompt_tokens <= 0) return bad("num_prompt_tokens=", num_prompt_tokens);
  const int pages_needed = (num_prompt_tokens + local.block_size() - 1) / local.block_size();
  if (descriptor.page_ids_size() < pages_needed) {
    return bad(descriptor.page_ids_size(), " page ids for a prompt of ", num_prompt_tokens,
               " tokens (", pages_needed, " pages of ", local.block_size(), ")");
  }
  if (descriptor.ranks_size() != dst_tp) {
    return bad(descriptor.ranks_size(), " ranks for tp_size=", dst_tp);
  }
  const ReshardShape shape{total_heads, local.head_dim(), local.block_size(), kKvDtypeBytes};
  const int64_t dst_page_bytes = PageLayerBytes(shape, dst_tp);
  int64_t max_page = 0;
  absl::flat_hash_set<int32_t> distinct;
  for (int32_t page : descriptor.page_ids()) {
    if (page < 0) return bad("negative page id ", page);
    if (!distinct.insert(page).second) return bad("page id ", page, " named twice");
    max_page = std::max<int64_t>(max_page, page);
  }
  for (int r = 0; r < dst_tp; ++r) {
    const estuary::v1::KvRankRegions& rank = descriptor.ranks(r);
    if (rank.tp_rank() != r) return bad("ranks[", r, "].tp_rank=", rank.tp_rank());
    if (rank.worker_address().size() > kMaxDescriptorAddressBytes) {
      return bad("ranks[", r, "].worker_address of ", rank.worker_address().size(),
                 " bytes (at most ", kMaxDescriptorAddressBytes, ")");
    }
    if (rank.layers_size() != local.n_layers()) {
      return bad("ranks[", r, "] has ", rank.layers_size(), " layer regions, want ",
                 local.n_layers());
    }
    for (int l = 0; l < local.n_layers(); ++l) {
      const estuary::v1::KvRemoteRegion& region = rank.layers(l);
      if (static_cast<int64_t>(region.bytes()) < (max_page + 1) * dst_page_bytes) {
        return bad("ranks[", r, "].layers[", l, "] has ", region.bytes(),
                   " bytes, too few for page ", max_page);
      }
      if (region.base_address() > UINT64_MAX - region.bytes()) {
        return bad("ranks[", r, "].layers[", l, "] wraps around the address space");
      }
      if (region.rkey().empty() || region.rkey().size() > kMaxDescriptorRkeyBytes) {
        return bad("ranks[", r, "].layers[", l, "] has an rkey of ", region.rkey().size(),
                   " bytes (1 to ", kMaxDescriptorRkeyBytes, ")");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace estuary::kvtransfer
