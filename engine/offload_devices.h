// OffloadDevices: the block devices an engine's stage keeps state on when
// zero_optimization.offload_optimizer.device or (stage 3)
// offload_param.device is "nvme": the ones given in EngineOptions, or files
// <nvme_path>/zerostep_rank<r>_{optimizer,params}.swap that it opens itself,
// truncated (a run's state comes from construction or load_checkpoint(),
// never from what an earlier run left in the file).
//
// Ownership: the devices it opened live as long as it does; given devices
// must outlive it. Either must outlive the stage that uses them.
// Thread safety: none.
#ifndef ZEROSTEP_ENGINE_OFFLOAD_DEVICES_H_
#define ZEROSTEP_ENGINE_OFFLOAD_DEVICES_H_

#include <memory>

#include "config/config.h"
#include "offload/block_device.h"
#include "zero/optimizer.h"
#include "zero/stage.h"

namespace zerostep {

class OffloadDevices {
 public:
  // IoError if an nvme_path cannot hold the state (missing, not a
  // directory, not writable).
  OffloadDevices(const ZeroConfig& zero, int rank,
                 BlockDevice* given_optimizer_device,
                 BlockDevice* given_param_device);

  // Where the optimizer keeps its state (device nullptr: in memory).
  const OptimizerSwap& optimizer_swap() const { return optimizer_swap_; }
  // Stage 3: where the parameter partitions live (device nullptr: memory).
  const ParamSwap& param_swap() const { return param_swap_; }

 private:
  std::unique_ptr<BlockDevice> owned_optimizer_device_;
  std::unique_ptr<BlockDevice> owned_param_device_;
  OptimizerSwap optimizer_swap_;
  ParamSwap param_swap_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_OFFLOAD_DEVICES_H_
