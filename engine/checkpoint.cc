// Engine's checkpoint orchestration: save_checkpoint, load_checkpoint and
// export_full_model (engine/engine.h for their contracts, engine/
// checkpoint_io.h for the files). The ranks' agreements go through
// zero/agreement.h; this file issues no collective itself.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/errors.h"
#include "common/log.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
#include "zero/agreement.h"

namespace zerostep {
namespace {

std::string rank_file(int r) { return "rank_" + std::to_string(r) + ".bin"; }

}  // namespace

void Engine::require_between_windows(const char* what) {
  // Every rank learns every rank's window, so all agree on the answer.
  agree_between_windows(*comm_, boundary_.window_backwards(), what);
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  // Names starting with '.' are the save's own (Note [Checkpoint switch]).
  if (tag.empty() || tag.find('/') != std::string::npos || tag == "latest" ||
      tag[0] == '.')
    throw UsageError("checkpoint tag '" + tag +
                     "' must be a non-empty name without '/', not starting "
                     "with '.', other than 'latest'");
  require_between_windows("save_checkpoint()");
  // Note [Checkpoint switch] (engine/checkpoint_io.h).
  CheckpointFiles& files = *checkpoint_files_;
  const std::string folder = dir + "/" + tag;
  const std::string staging = staging_folder(dir, tag);
  const std::string backup = backup_folder(dir, tag);
  // Rank 0 prepares an empty staging folder before any rank writes to it.
  bool prepare_failed = false;
  std::string error;
  if (rank() == 0) {
    try {
      make_dirs(dir);
      if (path_exists(backup)) {
        if (path_exists(folder)) {
          remove_tree(files, backup);
        } else {
          files.rename(backup, folder);
        }
        files.sync_folder(dir);
      }
      remove_tree(files, staging);
      files.make_folder(staging);
      files.sync_folder(dir);
    } catch (const Error& e) {
      prepare_failed = true;
      error = e.what();
    }
  }
  if (root_failed(*comm_, prepare_failed))
    throw IoError("save_checkpoint('" + folder +
                  "') could not prepare its staging folder '" + staging +
                  "' on rank 0" + (rank() == 0 ? ": " + error : std::string()) +
                  ". The previous checkpoint is untouched");
  // Each rank writes its file; failures are shared so every rank throws.
  uint64_t bytes = 0, checksum = 0;
  try {
    RankState st;
    st.rank = rank();
    st.segments = stage_->owned_segments();
    st.params = stage_->owned_parameters();
    st.exp_avg = stage_->optimizer().exp_avg();
    st.exp_avg_sq = stage_->optimizer().exp_avg_sq();
    const std::string encoded = encode_rank_state(st);
    atomic_write_file(files, staging + "/" + rank_file(rank()), encoded);
    bytes = encoded.size();
    checksum = fnv1a64(encoded.data(), encoded.size());
  } catch (const Error& e) {
    error = e.what();
  }
  RankOutcome mine;
  mine.failed = !error.empty();
  mine.bytes = bytes;
  mine.checksum = checksum;
  const std::vector<RankOutcome> all = share_outcomes(*comm_, mine);
  for (int r = 0; r < world_size(); ++r)
    if (all[r].failed)
      throw IoError("save_checkpoint('" + folder + "') failed on rank " +
                    std::to_string(r) +
                    (r == rank() ? ": " + error : std::string()) +
                    ". The previous checkpoint is untouched");
  // Rank 0 completes the staging folder with the manifest, switches it in
  // and writes `latest`, and tells everyone whether that worked, so every
  // rank returns (or throws) together.
  bool manifest_failed = false;
  std::string manifest_error;
  if (rank() == 0) {
    Manifest m;
    m.world_size = world_size();
    m.stage = config_.zero.stage;
    m.numel = layout_.numel;
    m.param_numels.assign(layout_.numels.begin(), layout_.numels.end());
    m.optimizer = to_string(config_.optimizer.type);
    m.optimizer_steps = stage_->optimizer().step_count();
    const auto c = boundary_.counters();
    m.micro_steps = c.micro_steps;
    m.global_steps = c.global_steps;
    m.global_samples = c.global_samples;
    m.skipped_steps = c.skipped_steps;
    m.lr_schedule_iteration = lr_schedule_.last_batch_iteration();
    m.dtype = to_string(dtype());
    const LossScaler::State& ls = scaler_.state();
    m.loss_scale = ls.scale;
    m.loss_scale_iteration = ls.iteration;
    m.last_overflow_iteration = ls.last_overflow_iteration;
    m.hysteresis_left = ls.hysteresis_left;
    for (int r = 0; r < world_size(); ++r)
      m.files.push_back({rank_file(r), all[r].bytes, all[r].checksum});
    try {
      atomic_write_file(files, staging + "/manifest.json", encode_manifest(m));
      const bool replacing = path_exists(folder);
      if (replacing) {
        files.rename(folder, backup);
        files.sync_folder(dir);
      }
      files.rename(staging, folder);
      files.sync_folder(dir);
      atomic_write_file(files, dir + "/latest", tag + "\n");
      if (replacing) {
        remove_tree(files, backup);
        files.sync_folder(dir);
      }
    } catch (const Error& e) {
      manifest_failed = true;
      manifest_error = e.what();
    }
  }
  if (root_failed(*comm_, manifest_failed))
    throw IoError("save_checkpoint('" + folder +
                  "') could not write its "
                  "manifest or switch it in on rank 0" +
                  (rank() == 0 ? ": " + manifest_error : std::string()) +
                  ". Under this tag the previous checkpoint or the new one "
                  "loads; `latest` names a loadable checkpoint");
}

void Engine::load_checkpoint(const std::string& dir, const std::string& tag_in,
                             const LoadOptions& options) {
  if (boundary_.window_backwards() != 0 || boundary_.in_step())
    throw UsageError(
        "load_checkpoint() inside an open accumulation window: "
        "call step() first. Nothing was changed");
  std::string tag = tag_in;
  if (tag.empty()) {
    tag = read_file(dir + "/latest");
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' '))
      tag.pop_back();
  }
  // <tag>, or what an interrupted save left (Note [Checkpoint switch]).
  const std::string folder = resolve_checkpoint_folder(dir, tag);
  const std::string manifest_path = folder + "/manifest.json";
  const Manifest m = decode_manifest(read_file(manifest_path), manifest_path);
  bool known_optimizer = false;
  for (OptimizerType t :
       {OptimizerType::kAdam, OptimizerType::kAdamW, OptimizerType::kSGD})
    known_optimizer |= m.optimizer == to_string(t);
  if (!known_optimizer)
    throw IoError("checkpoint manifest '" + manifest_path +
                  "' is corrupt: field 'optimizer' = \"" + m.optimizer +
                  "\" names no optimizer. Fix: load another checkpoint "
                  "(nothing was changed)");
  auto mismatch = [&](const std::string& what, const std::string& theirs,
                      const std::string& ours, const std::string& fix) {
    throw UsageError("checkpoint '" + folder + "' was written with " + what +
                     " " + theirs + ", this engine has " + ours + ". " + fix +
                     " Nothing was changed");
  };
  const std::vector<size_t> numels(m.param_numels.begin(),
                                   m.param_numels.end());
  if (numels != layout_.numels) {
    // Name the first parameter that differs: the totals may well agree.
    size_t i = 0;
    while (i < numels.size() && i < layout_.numels.size() &&
           numels[i] == layout_.numels[i])
      ++i;
    std::string first;
    if (i < layout_.numels.size()) {
      size_t k = 0;
      for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
        if (!item.value().requires_grad()) continue;
        if (k++ != i) continue;
        std::string shape;
        for (int64_t d : item.value().sizes())
          shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        first = "parameter " + std::to_string(i) + " ('" + item.key() +
                "', shape [" + shape + "], " +
                std::to_string(layout_.numels[i]) + " elements) has " +
                (i < numels.size() ? std::to_string(numels[i]) + " elements"
                                   : std::string("no counterpart")) +
                " in the checkpoint";
        break;
      }
    } else {
      first = "the checkpoint has " + std::to_string(numels.size() - i) +
              " parameter(s) more, from parameter " + std::to_string(i);
    }
    mismatch("a model of " + std::to_string(numels.size()) + " parameters",
             "(" + std::to_string(m.numel) + " elements)",
             std::to_string(layout_.numels.size()) + " (" +
                 std::to_string(layout_.numel) +
                 " elements); the first "
                 "difference: " +
                 first,
             "Load it into the same model.");
  }
  if (m.optimizer != to_string(config_.optimizer.type))
    mismatch("optimizer", m.optimizer, to_string(config_.optimizer.type),
             "Use the same optimizer.");
  const int their_world = m.world_size;
  const int their_stage = m.stage;
  if (!options.allow_reshard &&
      (their_world != world_size() || their_stage != config_.zero.stage))
    mismatch("world size / ZeRO stage",
             std::to_string(their_world) + " / " + std::to_string(their_stage),
             std::to_string(world_size()) + " / " +
                 std::to_string(config_.zero.stage),
             "Pass LoadOptions{.allow_reshard = true} to re-partition it.");
  // Read and verify every rank file, assembling the canonical vectors.
  const size_t n = layout_.numel;
  const bool has_m = !stage_->optimizer().exp_avg().empty();
  const bool has_v = !stage_->optimizer().exp_avg_sq().empty();
  std::vector<float> params(n, 0.0f), exp_avg(has_m ? n : 0, 0.0f),
      exp_avg_sq(has_v ? n : 0, 0.0f);
  std::vector<char> covered(n, 0);
  for (const Manifest::File& f : m.files) {
    const std::string path = folder + "/" + f.name;
    const std::string bytes = read_file(path);
    if (bytes.size() != f.bytes ||
        fnv1a64(bytes.data(), bytes.size()) != f.fnv1a)
      throw IoError("checkpoint file '" + path +
                    "' does not match its "
                    "manifest (size or checksum): truncated or replaced. "
                    "Nothing was changed");
    RankState st = decode_rank_state(bytes, path);
    if (has_m != !st.exp_avg.empty() || has_v != !st.exp_avg_sq.empty())
      mismatch("optimizer state", "of another shape", "its own",
               "Use the same optimizer settings.");
    for (const Segment& g : st.segments) {
      if (g.canonical_offset + g.numel > n)
        throw IoError("checkpoint file '" + path +
                      "' maps state outside the "
                      "model. Nothing was changed");
      std::memcpy(params.data() + g.canonical_offset,
                  st.params.data() + g.state_offset, g.numel * sizeof(float));
      if (has_m)
        std::memcpy(exp_avg.data() + g.canonical_offset,
                    st.exp_avg.data() + g.state_offset,
                    g.numel * sizeof(float));
      if (has_v)
        std::memcpy(exp_avg_sq.data() + g.canonical_offset,
                    st.exp_avg_sq.data() + g.state_offset,
                    g.numel * sizeof(float));
      std::fill(covered.begin() + g.canonical_offset,
                covered.begin() + g.canonical_offset + g.numel, 1);
    }
  }
  if (std::find(covered.begin(), covered.end(), 0) != covered.end())
    throw IoError("checkpoint '" + folder +
                  "' does not cover every "
                  "parameter (a rank file is missing from the manifest). "
                  "Nothing was changed");
  const AccumulationBoundary::Counters counters{
      m.micro_steps, m.global_steps, m.global_samples, m.skipped_steps};
  // The loss scale continues only into fp16 training.
  std::optional<LossScaler::State> scaler_state;
  if (dtype() == Precision::kFp16 && m.dtype == "fp16")
    scaler_state =
        LossScaler::State{m.loss_scale, m.loss_scale_iteration,
                          m.last_overflow_iteration, m.hysteresis_left};
  // Everything is verified: apply.
  int64_t optimizer_steps = m.optimizer_steps;
  if (!options.load_optimizer_states) {
    std::fill(exp_avg.begin(), exp_avg.end(), 0.0f);
    std::fill(exp_avg_sq.begin(), exp_avg_sq.end(), 0.0f);
    optimizer_steps = 0;
  }
  stage_->load_state(params, exp_avg, exp_avg_sq, optimizer_steps);
  binding_->params_written();
  if (scaler_state) scaler_.restore(*scaler_state);
  boundary_.restore(counters);
  lr_schedule_.set_last_batch_iteration(m.lr_schedule_iteration);
  // Legal, but say so: the weights may round differently and the loss
  // scale starts afresh (or is dropped).
  if (rank() == 0 && m.dtype != to_string(dtype()))
    log_message(
        LogLevel::kInfo,
        "checkpoint '" + folder + "' was written by a " + m.dtype +
            " engine and loads into this " + to_string(dtype()) +
            " engine: its float32 master weights and moments are used as "
            "they are" +
            (dtype() == Precision::kBf16
                 ? ", the model's bf16 weights are rounded from them"
                 : "") +
            (dtype() == Precision::kFp16
                 ? ", and the loss scale starts at its configured initial "
                   "value"
                 : "") +
            (m.dtype == "fp16"
                 ? "; the checkpoint's fp16 loss scale is not used"
                 : ""));
}

void Engine::export_full_model(const std::string& path) {
  torch::Tensor all = full_parameters();
  if (rank() != 0) return;
  nlohmann::json h;
  h["format"] = "zerostep-model-1";
  nlohmann::json params = nlohmann::json::array();
  size_t i = 0;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params.push_back({{"name", item.key()},
                      {"shape", item.value().sizes().vec()},
                      {"numel", layout_.numels[i++]}});
  }
  h["params"] = params;
  h["dtype"] = "float32";
  const std::string header = h.dump();
  std::string out = "ZSMODEL1";
  for (int b = 0; b < 8; ++b)
    out.push_back(
        static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * b)));
  out += header;
  out.append(reinterpret_cast<const char*>(all.data_ptr<float>()),
             static_cast<size_t>(all.numel()) * sizeof(float));
  atomic_write_file(path, out);
}

}  // namespace zerostep
