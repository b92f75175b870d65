// FlatOptimizer: Adam, AdamW and SGD over one flat float32 span (a rank's
// partition, or the whole model at stage 0), with the semantics of LibTorch's
// torch::optim::Adam / AdamW / SGD (bias correction from the step count;
// Adam adds weight_decay·p to the gradient, AdamW decays p by lr·wd before
// the Adam update; SGD momentum with dampening 0, no Nesterov).
//
// State (exp_avg, exp_avg_sq or the momentum buffer) is allocated once, at
// construction, for exactly the span's length (and, from the first save(),
// a small scratch: Note [Moments written at commit]): in the memory of the
// optimizer's Kernels (the host, or the device the parameters are on: Note
// [Device kernels] in zero/kernels.h), or, with an OptimizerSwap, on a
// BlockDevice (NVMe offload, Note [NVMe optimizer state]).
//
// Note [NVMe optimizer state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With OptimizerSwap::device set, the moments live in a SwapStore
// (offload/swap_store.h) on that device and stream through the store's
// sub-group buffers during step(): the read of sub-group i + 1 and the
// write of i - 1 overlap the fused update of i. step() updates the
// parameters in place and *prepares* the new moments (durable in the
// store's spare copy); commit() makes them the state once the caller's
// update has succeeded everywhere (the stages call it after their
// all-gather), restore() discards them. The caller keeps its own copy of
// the parameters to restore (Note [Transactional update] in zero/stage.h),
// so a failed step - an I/O error here or a collective there - leaves
// parameters and moments both at their old values. One case cannot be
// undone: commit() failing after the other ranks committed (the store's
// indeterminate record write); the rank reports IoError and the job
// resumes from a checkpoint. Memory: the store's buffers only (about
// buffer_count × arrays × sub_group_numel × 4 bytes); exp_avg() and
// exp_avg_sq() read the whole state into a vector they return
// (checkpoints).
//
// Thread safety: none; one optimizer per rank.
#ifndef ZEROSTEP_ZERO_OPTIMIZER_H_
#define ZEROSTEP_ZERO_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zero/kernels.h"

namespace zerostep {

enum class OptimizerKind { kAdam, kAdamW, kSGD };

struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD only
  // Adam/AdamW: false divides neither moment by (1 - beta^t) (DeepSpeed's
  // optimizer.params.bias_correction; offload/fused_adam.h).
  bool bias_correction = true;
  // Threads the host's Adam/AdamW pass is split over
  // (FusedAdamOptions::threads); the bits never depend on it. The engine
  // passes LibTorch's intra-op thread count.
  int threads = 1;
};

// How Adam/AdamW updates are computed. Both give the same bits (no FMA in
// either; offload/fused_adam.h): kFused is the vectorized single-pass
// kernel, kReference the plain scalar loop the kernel is tested against.
enum class AdamKernel { kFused, kReference };

class BlockDevice;
class SwapStore;
struct AdamStepParams;

// Where the optimizer state lives (Note [NVMe optimizer state]).
struct OptimizerSwap {
  // nullptr: in memory. Otherwise the device holding the state; it must
  // outlive the optimizer and is used by it alone.
  BlockDevice* device = nullptr;
  // Elements per sub-group (zero_optimization.sub_group_size), >= 1; the
  // last sub-group may be shorter.
  size_t sub_group_numel = size_t{1} << 22;
  // DeepSpeed's offload_optimizer.buffer_count: buffers of one state
  // array's sub-group. A store buffer holds the sub-group of every array,
  // so the store gets max(3, buffer_count / arrays) of them (3: the read
  // of i + 1 and the write of i - 1 both overlap the update of i).
  size_t buffer_count = 4;
};

class FlatOptimizer {
 public:
  // Throws UsageError for bad swap options, IoError if the device cannot
  // hold the state (the initial zero state is written here). `kernels`
  // (nullptr: host_kernels()) must outlive the optimizer; the parameters
  // and gradients step() takes are in its memory. A swapped state and
  // kReference need host-addressable kernels (UsageError otherwise).
  FlatOptimizer(const OptimizerHyper& hyper, size_t numel,
                AdamKernel kernel = AdamKernel::kFused,
                const OptimizerSwap& swap = {}, Kernels* kernels = nullptr);
  ~FlatOptimizer();
  FlatOptimizer(FlatOptimizer&&) noexcept;

  // One update of params[0, numel) from grads[0, numel) with `hyper`
  // (which may differ from the constructor's, e.g. a scheduled lr; the kind
  // must not change: UsageError). After save() or swapped, the new moments
  // are not yet the state: commit() or restore() must follow before the
  // next step or state read (Note [Moments written at commit]; UsageError
  // otherwise). Swapped: IoError if the device fails, with
  // the moments and step_count() unchanged and params partly updated (the
  // caller restores its copy).
  void step(float* params, const float* grads, const OptimizerHyper& hyper);
  // The same update with the new parameters written to params_out, which
  // is params_in itself or does not overlap it (params_in keeps its
  // values): Note [Update out of place] in offload/fused_adam.h.
  void step(const float* params_in, float* params_out, const float* grads,
            const OptimizerHyper& hyper);
  // A piece of an update whose parameters are not one span (stage 2's
  // chunks of its buckets): state elements [state_offset, state_offset +
  // numel) belong to the parameters at `in`, whose new values go to `out`
  // (`in` itself or apart).
  struct Piece {
    const float* in = nullptr;
    float* out = nullptr;
    size_t state_offset = 0;
    size_t numel = 0;
    // After save(), in memory: the new parameters are written by commit()
    // (to `out`, which may be `in`), with the moments, not by step(): for
    // parameters nobody needs before the update has succeeded (stage 3's
    // block groups, gathered when next used). Ignored otherwise.
    bool at_commit = false;
  };
  // Whether step() takes more than one piece: not with a swapped state,
  // which streams through one contiguous span (the caller gathers the
  // parameters into one then).
  bool steps_pieces() const { return store_ == nullptr; }
  // One update, piece by piece: the same bits as one contiguous span.
  // `pieces` cover [0, numel()) in state order; `grads` is contiguous in
  // state order.
  void step(const std::vector<Piece>& pieces, const float* grads,
            const OptimizerHyper& hyper);

  int64_t step_count() const { return step_count_; }
  size_t numel() const { return numel_; }
  // Adam/AdamW: first and second moments. SGD: exp_avg is the momentum
  // buffer, exp_avg_sq is empty. A copy in host memory, read from wherever
  // the state lives (a device: waits for it; swapped: IoError if the read
  // fails).
  std::vector<float> exp_avg() const;
  std::vector<float> exp_avg_sq() const;
  // How many of them hold state: 2 (Adam), 1 (SGD with momentum) or 0.
  size_t state_arrays() const { return num_arrays_; }
  // Bytes of optimizer state held in memory (swapped: the store's buffers).
  size_t state_bytes() const;
  // Whether the state lives on a device, and the store holding it.
  bool swapped() const { return store_ != nullptr; }
  const SwapStore* swap_store() const { return store_.get(); }
  // Restores a checkpointed state: `exp_avg` / `exp_avg_sq` must be as long
  // as exp_avg() / exp_avg_sq() are. UsageError on a mismatch (nothing
  // changes then).
  void load_state(int64_t step_count, std::vector<float> exp_avg,
                  std::vector<float> exp_avg_sq);

  // Everything step() changes besides the parameters: the step count and
  // the moments. save() records them in `*out`; restore() puts them back,
  // after at most one step() since the save. Used to undo an update whose
  // collective failed (Note [Transactional update] in zero/stage.h).
  //
  // Note [Moments written at commit]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // In memory, from the first save() on, step() writes the new parameters
  // only: it reads the moments without writing them (the new moments of
  // each piece of at most kCommitChunk elements go to a scratch and are
  // dropped), and commit() writes them, in place, by running the same
  // update again over the same inputs with the parameters' output sent to
  // the scratch. Every element's update is a function of its own inputs
  // (parameter, gradient, moments, step), so the moments commit() writes
  // are bitwise those step() computed, and restore() has nothing to undo
  // but the step count: no copy of the old moments is kept. The cost is
  // the scratch (state_arrays() x min(numel, kCommitChunk) floats,
  // rollback_bytes()) and a second pass over the moments per step. The
  // caller's part of the contract: between step() and commit(), the
  // step's input parameters (Piece::in, which may be its output: then the
  // caller puts the old values back first) and the gradients hold what
  // step() read. Before the first save() (stage 0) the moments are written
  // in step() itself. Swapped (Note [NVMe optimizer state]): the device
  // keeps the old moments itself, so save() records the step count only;
  // step() prepares the new moments; commit() makes them the state (call
  // it once the update's collectives succeeded) and restore() discards
  // them. Either way a step() must be followed by commit() or restore()
  // before the next step() or state read (UsageError otherwise). commit()
  // throws IoError if the device fails; the old moments stay then and the
  // caller restores. In memory, commit() cannot fail.
  static constexpr size_t kCommitChunk = size_t{1} << 18;
  struct Snapshot {
    int64_t step_count = 0;
  };
  void save(Snapshot* out);
  void restore(const Snapshot& snapshot);
  void commit();
  // Bytes of the commit scratch (0 before the first save, and swapped).
  size_t rollback_bytes() const;

 private:
  OptimizerKind kind_;
  AdamKernel kernel_;
  size_t numel_;
  int64_t step_count_ = 0;
  Kernels* kernels_;
  // In memory: the state, in kernels_'s memory. Swapped: empty.
  DeviceArray exp_avg_;
  DeviceArray exp_avg_sq_;
  // Note [Moments written at commit]: whether steps defer the moments
  // (from the first save() on, in memory), the scratch, and the step
  // awaiting commit() or restore().
  bool deferred_ = false;
  DeviceArray scratch_;
  struct Pending {
    std::vector<Piece> pieces;
    const float* grads = nullptr;
    OptimizerHyper hyper;
  };
  std::unique_ptr<Pending> pending_;
  size_t num_arrays_ = 0;  // state arrays: 2 (Adam), 1 or 0 (SGD)
  std::unique_ptr<SwapStore> store_;
  // Array i (0: exp_avg, 1: exp_avg_sq) as a host vector.
  std::vector<float> read_array(size_t i) const;
  void step_swapped(float* params, const float* grads,
                    const OptimizerHyper& hyper);
  // LibTorch's Adam/AdamW loop over n elements, in place.
  void reference_adam(float* params, const float* grads, float* m, float* v,
                      size_t n, const OptimizerHyper& hyper);
  // Sizes the scratch for `arrays` state arrays.
  void fit_scratch(size_t arrays);
  // UsageError if a step awaits commit() or restore(); `what` is the call.
  void require_settled(const char* what) const;
  // One update of n elements, state elements from `o`; moments read at
  // m_in / v_in (nullptr: none yet, zeros) and written to m_out / v_out
  // (each its in array or apart); step_count_ is the update's step.
  void update(const float* p_in, float* p_out, const float* g,
              const float* m_in, float* m_out, const float* v_in,
              float* v_out, size_t n, const OptimizerHyper& hyper);
  AdamStepParams adam_params(const OptimizerHyper& hyper,
                                    int64_t step) const;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_OPTIMIZER_H_
