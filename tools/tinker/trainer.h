// RankTrainer: one rank's side of the trainer server. It owns this rank's
// replica of every model (a TinyGpt under an Engine in unmanaged mode with
// gradient_accumulation_scaling "none") and executes Commands (Note [One
// command stream] in command.h).
//
// Engine mapping:
//   create_model     a TinyGpt from the base-model table (same weights on
//                    every rank and for every model of that base), with
//                    LoRA adapters of the request's rank on its linear
//                    layers and every base weight frozen; no lora_config
//                    means full fine-tuning. Then an Engine over it.
//   forward_backward datums are dealt to ranks by their position in the
//                    window (Note [Window positions]): one forward and
//                    one backward() per row of W positions on every rank.
//                    Each rank's loss is multiplied by W because the engine
//                    averages gradients over ranks; the accumulated
//                    gradient is the sum over datums of the protocol's
//                    (summed) losses.
//   optim_step       backpropagates the window's last, partial row, then
//                    one Engine::step() with the request's AdamParams as
//                    StepOverrides (decoupled AdamW); reports the
//                    parameter digest in its metrics.
//   save_weights /   Engine::save_checkpoint / load_checkpoint under
//   load_weights     options.state_dir (re-partitioning allowed; weights
//                    only unless the request asks for the optimizer).
//   save_weights_external
//                    CheckpointStore::save_external: Engine::
//                    export_full_model on every rank (a collective), the
//                    files written by rank 0 (export_weights.h).
//   save_weights_for_sampler, create_sampling_session, get_sampler, sample
//                    SamplerStore (sampling.h): the snapshot's gather runs
//                    on every rank; sessions and sampling on rank 0 alone,
//                    the other ranks executing them as no-ops.
//   stable_reinforce rank 0 resolves every datum's provenance against the
//                    sampler's records and broadcasts q (Note [Stability
//                    records] in stability.h) before any forward.
//   listings, runs, deletes, TTLs, copies, weights_info
//                    CheckpointStore on rank 0 alone; while idle (noop)
//                    rank 0 sweeps expired checkpoints once a minute.
//
// Note [Window positions]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A window is a model's datums since its last optim_step, numbered 0, 1,
// ... in the order they arrive (forward_only requests are not part of it).
// Datum p belongs to rank p % W and to row p / W, and row k is backward()
// call k + 1 of the window on every rank. A row is backpropagated when its
// W datums are known: a request that ends inside a row returns every
// datum's outputs at once (the row's forward runs without gradients) and
// keeps the row's datums pending; the request that completes the row runs
// their forward again with gradients and backpropagates it, and
// optim_step backpropagates a row still partial, a rank without a datum
// contributing zero. So every rank runs the same backward() calls, on the
// same datums, in the same order, whatever the split of the window into
// requests: the update is bitwise the same for [101], [51, 50] or
// 101 x [1] at every world size and stage (trainer_test), and so are the
// returned logprobs. The forward that is run twice costs one forward per
// rank per request boundary inside a row. save_weights and load_weights
// of a model with an open window (datums since its optim_step, pending or
// not) are refused, as the engine refuses a checkpoint inside a window.
//
// Every request is validated completely, on every rank, before the first
// collective, so a bad one fails everywhere with a "user" error and changes
// nothing (checked by parameter digests in tests).
//
// The parts: base_model.h (the served presets), model_registry.h (the
// models and create_model), losses.h (request checks and the losses),
// checkpoints.h (save_weights / load_weights under state_dir), sampling.h
// (sampler snapshots and sample requests); this file
// drives them (forward_backward, optim_step, get_info).
//
// Thread safety: execute() is called from this rank's thread only. Model
// construction takes a process-wide lock (torch's global RNG is shared by
// the simulator's rank threads).
#ifndef ZEROSTEP_TOOLS_TINKER_TRAINER_H_
#define ZEROSTEP_TOOLS_TINKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/cli.h"               // AvailableMemory
#include "tools/tinker/base_model.h"  // base_models(), for the server
#include "tools/tinker/command.h"

namespace zerostep {
namespace tinker {

struct TrainerOptions {
  // A ds_config JSON document (may be empty: stage 0 defaults). The server
  // fills in managed_gradient_accumulation = false,
  // gradient_accumulation_scaling = "none", a micro-batch of 1 and AdamW;
  // a document that sets any of them otherwise is a ConfigError.
  std::string ds_config_json;
  // Where save_weights writes: <state_dir>/<model id>/<name>/.
  std::string state_dir = "/tmp/zerostep-tinker";
  // Seed of every base model's weights.
  uint64_t base_seed = 1234;
  // The ranks that share this process's memory (a simulated world: all of
  // them; one process per rank: 1), and what the process may still take
  // (default: available_memory(), common/cli.h; tests give their own):
  // Note [A model that cannot fit] in model_registry.h.
  int ranks_in_process = 1;
  std::function<std::optional<AvailableMemory>()> available_memory;
};

// The ds_config every model's Engine gets (validated; ConfigError if the
// document conflicts with the server's requirements). Exposed for tests.
std::string server_ds_config(const std::string& ds_config_json, int world_size);

class RankTrainer {
 public:
  // Validates the config (ConfigError). `*comm` must outlive the trainer.
  RankTrainer(Communicator* comm, const TrainerOptions& options);
  ~RankTrainer();
  RankTrainer(const RankTrainer&) = delete;
  RankTrainer& operator=(const RankTrainer&) = delete;

  // Executes `command` on this rank. Never throws for bad input: a
  // UsageError/ConfigError/IoError becomes a failed result ("user"); a
  // CommError or InternalError becomes a failed "server" result (the world
  // is then unusable: the caller should stop).
  CommandResult execute(const Command& command);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// FNV-1a 64 of the bytes of the given float32 values, in order.
uint64_t digest_floats(const float* data, size_t n);
std::string digest_hex(uint64_t digest);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_TRAINER_H_
