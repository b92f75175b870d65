#include "engine/offload_devices.h"

#include <string>

#include "engine/stage_factory.h"
#include "offload/posix_block_device.h"

namespace zerostep {
namespace {

// offload "nvme": `given`, or the file <nvme_path>/zerostep_rank<r>_<what>
// .swap kept in *owned; otherwise nullptr (in memory).
BlockDevice* swap_device(const OffloadConfig& o, int rank, BlockDevice* given,
                         const char* what,
                         std::unique_ptr<BlockDevice>* owned) {
  if (o.device != OffloadDevice::kNvme) return nullptr;
  if (given != nullptr) return given;
  PosixDeviceOptions po;
  po.truncate = true;
  *owned = PosixBlockDevice::open_in_directory(
      o.nvme_path,
      "zerostep_rank" + std::to_string(rank) + "_" + what + ".swap", po);
  return owned->get();
}

}  // namespace

OffloadDevices::OffloadDevices(const ZeroConfig& zero, int rank,
                               BlockDevice* given_optimizer_device,
                               BlockDevice* given_param_device) {
  optimizer_swap_.device =
      swap_device(zero.offload_optimizer, rank, given_optimizer_device,
                  "optimizer", &owned_optimizer_device_);
  optimizer_swap_.sub_group_numel = static_cast<size_t>(zero.sub_group_size);
  optimizer_swap_.buffer_count =
      static_cast<size_t>(zero.offload_optimizer.buffer_count);
  if (offload_param_applies(zero))
    param_swap_.device =
        swap_device(zero.offload_param, rank, given_param_device, "params",
                    &owned_param_device_);
  param_swap_.sub_group_numel = static_cast<size_t>(zero.sub_group_size);
  param_swap_.buffer_count =
      static_cast<size_t>(zero.offload_param.buffer_count);
}

}  // namespace zerostep
