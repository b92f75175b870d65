// Engine's checkpoint orchestration: save_checkpoint, load_checkpoint,
// export_full_model and load_model_weights (engine/engine.h for their
// contracts, engine/checkpoint_io.h and engine/safetensors.h for the
// files). The ranks' agreements go through
// zero/agreement.h; this file issues no collective itself.
#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "common/errors.h"
#include "common/log.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
#include "engine/safetensors.h"
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
  binding_->will_write_params();
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

void Engine::export_full_model(const std::string& path,
                               const ExportOptions& options) {
  const torch::Tensor all = full_parameters().contiguous();
  bool failed = false;
  std::string error;
  if (rank() == 0) {
    try {
      const bool bf16 = options.dtype == ExportOptions::Dtype::kBF16;
      SafetensorsFile file;
      file.metadata["format"] = "pt";
      const float* values = all.data_ptr<float>();
      size_t i = 0;
      for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
        if (!item.value().requires_grad()) continue;
        const size_t numel = layout_.numels[i++];
        SafetensorsTensor t;
        t.name = item.key();
        for (int64_t d : item.value().sizes())
          t.shape.push_back(static_cast<uint64_t>(d));
        // Little-endian hosts only (as the checkpoint files).
        if (bf16) {
          t.dtype = "BF16";
          t.data.resize(numel * 2);
          for (size_t k = 0; k < numel; ++k) {
            const uint16_t b = float_to_bf16(values[k]);
            std::memcpy(&t.data[2 * k], &b, 2);
          }
        } else {
          t.dtype = "F32";
          t.data.assign(reinterpret_cast<const char*>(values),
                        numel * sizeof(float));
        }
        values += numel;
        file.tensors.push_back(std::move(t));
      }
      atomic_write_file(*checkpoint_files_, path,
                        encode_safetensors(file, path));
    } catch (const Error& e) {
      failed = true;
      error = e.what();
    }
  }
  if (root_failed(*comm_, failed))
    throw IoError("export_full_model('" + path + "') failed on rank 0" +
                  (rank() == 0 ? ": " + error : std::string()) +
                  ". The file is unchanged");
}

void Engine::load_model_weights(const std::string& path) {
  if (boundary_.window_backwards() != 0 || boundary_.in_step())
    throw UsageError("load_model_weights('" + path +
                     "') inside an open accumulation window: call step() "
                     "first. Nothing was changed");
  const std::string bytes = read_file(path);
  if (bytes.compare(0, 8, "ZSMODEL1") == 0)
    throw IoError("'" + path +
                  "' is in zerostep's former export format (ZSMODEL1), "
                  "which is no longer read: exports are safetensors now. Fix: "
                  "load the checkpoint it came from and call "
                  "export_full_model again. Nothing was changed");
  const SafetensorsFile file = decode_safetensors(bytes, path);
  std::map<std::string, const SafetensorsTensor*> in_file;
  for (const SafetensorsTensor& t : file.tensors) in_file[t.name] = &t;
  auto shape_string = [](const std::vector<uint64_t>& shape) {
    std::string s;
    for (uint64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
    return "[" + s + "]";
  };
  // Every mismatch is collected, so that one error names them all.
  std::vector<std::string> problems;
  std::set<std::string> matched, frozen;
  std::vector<float> params(layout_.numel, 0.0f);
  size_t offset = 0, i = 0;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) {
      frozen.insert(item.key());
      continue;
    }
    const size_t numel = layout_.numels[i++];
    float* out = params.data() + offset;
    offset += numel;
    std::vector<uint64_t> shape;
    for (int64_t d : item.value().sizes())
      shape.push_back(static_cast<uint64_t>(d));
    const auto it = in_file.find(item.key());
    if (it == in_file.end()) {
      problems.push_back("parameter '" + item.key() + "' (shape " +
                         shape_string(shape) + ") is missing");
      continue;
    }
    matched.insert(item.key());
    const SafetensorsTensor& t = *it->second;
    bool fits = true;
    if (t.shape != shape) {
      problems.push_back("tensor '" + t.name + "' has shape " +
                         shape_string(t.shape) + ", the parameter " +
                         shape_string(shape));
      fits = false;
    }
    if (t.dtype != "F32" && t.dtype != "BF16") {
      problems.push_back("tensor '" + t.name + "' is " + t.dtype +
                         ": only F32 and BF16 load");
      fits = false;
    }
    if (!fits) continue;
    if (t.dtype == "F32") {
      std::memcpy(out, t.data.data(), numel * sizeof(float));
    } else {
      for (size_t k = 0; k < numel; ++k) {
        uint16_t b;
        std::memcpy(&b, &t.data[2 * k], 2);
        out[k] = bf16_to_float(b);
      }
    }
  }
  for (const SafetensorsTensor& t : file.tensors)
    if (!matched.count(t.name))
      problems.push_back("tensor '" + t.name + "' is not " +
                         (frozen.count(t.name)
                              ? "trainable (requires_grad is false)"
                              : "a parameter of the model"));
  if (!problems.empty()) {
    std::string message =
        "safetensors file '" + path +
        "' does not fit this model: " + std::to_string(problems.size()) +
        " mismatch" + (problems.size() == 1 ? "" : "es") + ":";
    for (const std::string& p : problems) message += "\n  " + p;
    throw UsageError(message +
                     "\nLoad a file of this model's parameters. Nothing was "
                     "changed");
  }
  // The optimizer's own state goes back in unchanged: load_state takes
  // canonical vectors, so this rank's owned moments are placed in them.
  const std::vector<Segment> segments = stage_->owned_segments();
  auto canonical = [&](const std::vector<float>& owned) {
    std::vector<float> full;
    if (owned.empty()) return full;
    full.assign(layout_.numel, 0.0f);
    for (const Segment& g : segments)
      std::memcpy(full.data() + g.canonical_offset,
                  owned.data() + g.state_offset, g.numel * sizeof(float));
    return full;
  };
  const FlatOptimizer& optimizer = stage_->optimizer();
  const std::vector<float> exp_avg = canonical(optimizer.exp_avg());
  const std::vector<float> exp_avg_sq = canonical(optimizer.exp_avg_sq());
  binding_->will_write_params();
  stage_->load_state(params, exp_avg, exp_avg_sq, optimizer.step_count());
  binding_->params_written();
}

}  // namespace zerostep
