#include "zero/schedule.h"

#include <algorithm>

#include "common/errors.h"
#include "zero/flat_layout.h"
#include "zero/stage1.h"
#include "zero/stage2.h"

namespace zerostep {
namespace {

using Event = ScheduleEvent;

Event collective(CollectiveKind kind, DType dtype, size_t numel,
                 const char* phase, ReduceOp op = ReduceOp::kSum,
                 bool async = false) {
  Event e;
  e.type = Event::Type::kCollective;
  e.kind = kind;
  e.op = op;
  e.dtype = dtype;
  e.numel = numel;
  e.phase = phase;
  e.async = async;
  return e;
}

Event compute(Event::Work work, double params) {
  Event e;
  e.type = Event::Type::kCompute;
  e.work = work;
  e.params = params;
  return e;
}

// Note [Window agreement]: three int64 per rank, all-gathered.
Event agreement(int world, const char* phase) {
  return collective(CollectiveKind::kAllGather, DType::kInt64,
                    3 * static_cast<size_t>(world), phase);
}

// A wait for each asynchronous collective in `launched` (event indices),
// in launch order.
void wait_for_all(const std::vector<size_t>& launched,
                  std::vector<Event>* out) {
  for (size_t idx : launched) {
    Event e;
    e.type = Event::Type::kWait;
    e.waits_for = idx;
    out->push_back(e);
  }
}

// The global-norm all-reduce of a partitioned gradient.
Event norm() {
  return collective(CollectiveKind::kAllReduce, DType::kFloat64, 1,
                    phase::kStep);
}

void check(const ModelShape& m, const ScheduleOptions& o) {
  if (o.stage < 0 || o.stage > 3)
    throw UsageError("schedule: stage " + std::to_string(o.stage) +
                     " is not a ZeRO stage (0-3)");
  if (o.world_size < 1) throw UsageError("schedule: world_size must be >= 1");
  if (o.backwards < 1) throw UsageError("schedule: backwards must be >= 1");
  if (m.numels.size() != m.block.size())
    throw UsageError(
        "model shape '" + m.name + "': " + std::to_string(m.numels.size()) +
        " parameters but " + std::to_string(m.block.size()) + " block entries");
}

// The step's update and gathers for stages 1-3 (after the norm).
void stage2_gathers(const FlatLayout& layout, const ScheduleOptions& o,
                    std::vector<Event>* out) {
  const size_t w = static_cast<size_t>(o.world_size);
  const size_t piece =
      internal::aligned_elements(o.allgather_bucket_size / o.world_size);
  for (const Span& b : internal::make_buckets(layout, o.reduce_bucket_size)) {
    const size_t chunk = b.numel / w;
    if (chunk <= piece) {
      out->push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                                b.numel, phase::kStep));
      continue;
    }
    for (size_t at = 0; at < chunk; at += piece)
      out->push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                                std::min(piece, chunk - at) * w, phase::kStep));
  }
}

}  // namespace

std::vector<ScheduleEvent> setup_schedule(const ModelShape& m,
                                          const ScheduleOptions& o) {
  check(m, o);
  std::vector<Event> out;
  if (o.stage < 3) {
    const FlatLayout layout = FlatLayout::make(m.numels, o.world_size);
    // Note [Partitioned master]: bf16 weights, two to a float32 word.
    const bool bits = o.dtype == Precision::kBf16 && o.stage > 0;
    out.push_back(collective(CollectiveKind::kBroadcast, DType::kFloat32,
                             layout.padded_numel / (bits ? 2 : 1),
                             phase::kSetup));
    return out;
  }
  for (const Stage3Group& g : stage3_groups(m, o.persistence_threshold))
    out.push_back(collective(CollectiveKind::kBroadcast, DType::kFloat32,
                             padded_numel(g.numel, o.world_size),
                             phase::kSetup));
  return out;
}

std::vector<ScheduleEvent> window_schedule(const ModelShape& m,
                                           const ScheduleOptions& o) {
  check(m, o);
  const int w = o.world_size;
  const double total = static_cast<double>(m.numel());
  std::vector<Event> out;
  const char* const reduce_phase = o.managed ? phase::kBackward : phase::kStep;
  if (o.stage <= 2) {
    const FlatLayout layout = FlatLayout::make(m.numels, w);
    const size_t padded = layout.padded_numel;
    const std::vector<Span> buckets =
        internal::make_buckets(layout, o.reduce_bucket_size);
    // The buckets' asynchronous collectives (stage 2's reduce-scatters,
    // stage 0's all-reduces, Note [Stage 0 buckets]): with `backward`, the
    // backward's compute first, with `overlap` each bucket launched as soon
    // as the backward has passed every parameter it holds (reverse
    // registration order); the rest after it in bucket order; then every
    // one waited for, in launch order.
    auto bucket_collectives = [&](CollectiveKind kind, const char* ph,
                                  ReduceOp op, bool backward, bool overlap) {
      std::vector<size_t> launched;  // event indices, in launch order
      std::vector<bool> done(buckets.size(), false);
      auto launch = [&](size_t b) {
        done[b] = true;
        launched.push_back(out.size());
        out.push_back(collective(kind, DType::kFloat32, buckets[b].numel, ph,
                                 op, true));
      };
      if (backward && overlap) {
        // A bucket goes once its lowest parameter is done.
        std::vector<size_t> first_param(buckets.size(), m.numels.size());
        for (size_t b = 0; b < buckets.size(); ++b)
          for (size_t p = 0; p < m.numels.size(); ++p) {
            const size_t begin = layout.offsets[p];
            if (m.numels[p] > 0 &&
                begin < buckets[b].offset + buckets[b].numel &&
                buckets[b].offset < begin + m.numels[p]) {
              first_param[b] = p;
              break;
            }
          }
        for (size_t p = m.numels.size(); p-- > 0;) {
          out.push_back(compute(Event::Work::kBackward,
                                static_cast<double>(m.numels[p])));
          for (size_t b = 0; b < buckets.size(); ++b)
            if (!done[b] && first_param[b] == p) launch(b);
        }
      } else if (backward) {
        out.push_back(compute(Event::Work::kBackward, total));
      }
      for (size_t b = 0; b < buckets.size(); ++b)
        if (!done[b]) launch(b);
      wait_for_all(launched, &out);
    };
    // Stage 0's window reduce; `backward`: inside the boundary backward.
    auto stage0_reduce = [&](const char* ph, bool backward) {
      out.push_back(agreement(w, phase::kStep));
      bucket_collectives(CollectiveKind::kAllReduce, ph, ReduceOp::kAvg,
                         backward, o.overlap_comm);
    };
    // Stage 1's window reduce (Note [Stage 1 reduce buckets]).
    auto stage1_reduce = [&] {
      const size_t part = layout.partition_numel;
      const size_t piece =
          internal::stage1_reduce_piece(layout, o.reduce_bucket_size);
      for (size_t at = 0; at < part; at += piece)
        out.push_back(collective(CollectiveKind::kReduceScatter,
                                 DType::kFloat32,
                                 std::min(piece, part - at) * w, reduce_phase,
                                 ReduceOp::kAvg));
    };
    for (int k = 1; k <= o.backwards; ++k) {
      out.push_back(compute(Event::Work::kForward, total));
      const bool boundary = o.managed && k == o.backwards;
      if (o.stage == 2) {
        out.push_back(agreement(w, phase::kBackward));
        bucket_collectives(CollectiveKind::kReduceScatter, phase::kBackward,
                           ReduceOp::kSum, true, o.overlap_comm);
      } else if (boundary && o.stage == 0 && o.overlap_comm) {
        // Note [Stage 0 buckets]: agreed before the autograd pass.
        stage0_reduce(phase::kBackward, true);
        continue;
      } else {
        out.push_back(compute(Event::Work::kBackward, total));
      }
      // Managed mode: the boundary backward agrees and reduces (stage 0/1).
      if (boundary) {
        if (o.stage == 0) stage0_reduce(reduce_phase, false);
        if (o.stage == 2) out.push_back(agreement(w, phase::kStep));
        if (o.stage == 1) {
          out.push_back(agreement(w, phase::kStep));
          stage1_reduce();
        }
      }
    }
    // step()
    if (!o.managed) {
      if (o.stage == 0) stage0_reduce(reduce_phase, false);
      if (o.stage == 1) {
        out.push_back(agreement(w, phase::kStep));
        stage1_reduce();
      }
      if (o.stage == 2) out.push_back(agreement(w, phase::kStep));
    }
    if (o.stage >= 1) out.push_back(norm());
    out.push_back(
        compute(Event::Work::kOptimizer,
                static_cast<double>(o.stage == 0 ? padded : padded / w)));
    if (o.stage == 1)
      out.push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                               padded, phase::kStep));
    if (o.stage == 2) stage2_gathers(layout, o, &out);
    return out;
  }
  // Stage 3.
  const std::vector<Stage3Group> groups =
      stage3_groups(m, o.persistence_threshold);
  const std::vector<bool> kept = stage3_kept_for_backward(
      groups, static_cast<size_t>(o.max_reuse_distance));
  size_t owned = 0;
  for (const Stage3Group& g : groups) owned += padded_numel(g.numel, w) / w;
  for (int k = 1; k <= o.backwards; ++k) {
    double persistent_params = 0.0;
    for (const Stage3Group& g : groups) {
      if (g.persistent) {
        persistent_params += static_cast<double>(g.numel);
        continue;
      }
      if (!o.gather_once_per_step || (k == 1 && o.first_window))
        out.push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                                 padded_numel(g.numel, w), phase::kForward));
      out.push_back(
          compute(Event::Work::kForward, static_cast<double>(g.numel)));
    }
    out.push_back(compute(Event::Work::kForward, persistent_params));
    out.push_back(agreement(w, phase::kBackward));
    for (size_t i = groups.size(); i-- > 0;) {
      const Stage3Group& g = groups[i];
      if (g.persistent) continue;
      const size_t padded = padded_numel(g.numel, w);
      if (!kept[i] && !o.gather_once_per_step)
        out.push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                                 padded, phase::kBackward));
      out.push_back(
          compute(Event::Work::kBackward, static_cast<double>(g.numel)));
      out.push_back(collective(CollectiveKind::kReduceScatter, DType::kFloat32,
                               padded, phase::kBackward));
    }
    out.push_back(compute(Event::Work::kBackward, persistent_params));
    for (const Stage3Group& g : groups)
      if (g.persistent)
        out.push_back(collective(CollectiveKind::kReduceScatter,
                                 DType::kFloat32, padded_numel(g.numel, w),
                                 phase::kBackward));
    if (o.managed && k == o.backwards)
      out.push_back(agreement(w, phase::kStep));
  }
  if (!o.managed) out.push_back(agreement(w, phase::kStep));
  out.push_back(norm());
  out.push_back(compute(Event::Work::kOptimizer, static_cast<double>(owned)));
  // The persistent groups and, with gather_once_per_step, every block group
  // for the next window: all in flight at once.
  std::vector<size_t> launched;
  for (const Stage3Group& g : groups) {
    if (!g.persistent && !o.gather_once_per_step) continue;
    launched.push_back(out.size());
    out.push_back(collective(CollectiveKind::kAllGather, DType::kFloat32,
                             padded_numel(g.numel, w), phase::kStep,
                             ReduceOp::kSum, true));
  }
  wait_for_all(launched, &out);
  return out;
}

MemoryStats MemoryPlan::stats() const {
  MemoryStats s;
  for (const MemoryTerm& t : terms) {
    switch (t.field) {
      case MemoryTerm::Field::kParams:
        s.param_bytes += t.bytes;
        break;
      case MemoryTerm::Field::kGrads:
        s.grad_bytes += t.bytes;
        break;
      case MemoryTerm::Field::kOptimizer:
        s.optimizer_state_bytes += t.bytes;
        break;
      case MemoryTerm::Field::kRollback:
        s.rollback_bytes += t.bytes;
        break;
    }
  }
  s.peak_bytes = total_bytes();
  return s;
}

size_t MemoryPlan::model_state_bytes() const {
  size_t n = 0;
  for (const MemoryTerm& t : terms)
    if (t.model_state) n += t.bytes;
  return n;
}

size_t MemoryPlan::total_bytes() const {
  size_t n = 0;
  for (const MemoryTerm& t : terms) n += t.bytes;
  return n;
}

namespace {

using Field = MemoryTerm::Field;

// Note [Moments written at commit] (zero/optimizer.h): a chunk of each
// state array, from the first save() on.
size_t commit_scratch_bytes(size_t owned, const ScheduleOptions& o) {
  return o.optimizer_bytes_per_element *
         std::min(owned, FlatOptimizer::kCommitChunk);
}

void add(MemoryPlan& p, const std::string& name, size_t bytes, Field field,
         bool model_state = false) {
  if (bytes > 0) p.terms.push_back({name, bytes, field, model_state});
}

// Stages 0-2 (Note [Memory plan]).
void flat_plan(const ModelShape& m, const ScheduleOptions& o, MemoryPlan& p) {
  const int w = o.world_size;
  const size_t f = sizeof(float);
  const FlatLayout layout = FlatLayout::make(m.numels, w);
  const size_t padded = layout.padded_numel;
  const size_t owned = o.stage > 0 ? padded / w : padded;
  const bool bf16 = o.dtype == Precision::kBf16;
  const bool fp16 = o.dtype == Precision::kFp16;
  // Note [Partitioned master] (zero/stage.h).
  const bool apart = bf16 && o.stage > 0;
  // Weights.
  if (bf16) {
    add(p, "weights (bf16, the model's)", padded * 2, Field::kParams, true);
    if (apart)
      add(p, "float32 master (owned elements)", owned * f, Field::kParams,
          true);
    else
      add(p, "float32 master", padded * f, Field::kParams, true);
  } else {
    add(p, "weights (float32, the master)", padded * f, Field::kParams, true);
  }
  // Gradients: a full buffer at stages 0-1 and, by design, with
  // reduce_once_per_step at stage 2.
  if (o.stage < 2 || o.reduce_once_per_step) {
    if (bf16) {
      add(p, "gradients of one backward (bf16)", padded * 2, Field::kGrads,
          true);
      add(p, "window accumulation (float32)", padded * f, Field::kGrads);
    } else {
      add(p, "gradients (window accumulation)", padded * f, Field::kGrads,
          true);
      if (fp16)
        add(p, "gradients of one backward (fp16 values, float32)",
            padded * f, Field::kGrads);
    }
    if (o.stage == 1) {
      add(p, "reduced gradient partition", owned * f, Field::kGrads);
      // Note [Stage 1 reduce buckets].
      const size_t piece =
          internal::stage1_reduce_piece(layout, o.reduce_bucket_size);
      if (piece < owned)
        add(p, "reduce staging (one bucket)", piece * w * f, Field::kGrads);
    }
    if (o.stage == 2) {
      add(p, "gradient partition (float32)", owned * f, Field::kGrads);
      add(p, "reduce scratch", owned * f, Field::kGrads);
    }
  } else {
    // Note [Stage 2 buckets] (zero/stage2.h).
    const std::vector<Span> buckets =
        internal::make_buckets(layout, o.reduce_bucket_size);
    size_t largest = 0;
    for (const Span& b : buckets) largest = std::max(largest, b.numel);
    const size_t slots = std::min<size_t>(buckets.size(), 2);
    add(p, "gradient partition (float32)", owned * f, Field::kGrads, true);
    add(p, "bucket pool", slots * largest * f, Field::kGrads);
    add(p, "bucket scratch", slots * (largest / w) * f, Field::kGrads);
  }
  if (o.stage == 2) {
    size_t largest = 0;
    for (const Span& b : internal::make_buckets(layout, o.reduce_bucket_size))
      largest = std::max(largest, b.numel);
    const size_t piece =
        internal::aligned_elements(o.allgather_bucket_size / w);
    const size_t chunk = largest / w;
    if (apart)
      add(p, "all-gather staging", std::min(chunk, piece) * w * f,
          Field::kParams);
    else if (chunk > piece)
      add(p, "all-gather staging", piece * w * f, Field::kParams);
  }
  // Optimizer state and rollback (Note [Transactional update]).
  add(p, "optimizer moments", owned * o.optimizer_bytes_per_element,
      Field::kOptimizer, true);
  if (o.stage > 0)
    add(p, "rollback: the moments' commit scratch",
        commit_scratch_bytes(owned, o), Field::kRollback);
  if (o.stage == 2 && (apart || !o.reduce_once_per_step))
    add(p, apart ? "rollback: the owned master" : "rollback: the owned weights",
        owned * f, Field::kRollback);
}

// Stage 3 at rest after a window (Note [Stage 3 buffer pool] in
// zero/stage3.h): one parameter slot of the largest block group (one per
// group kept by the reuse distance when there are more; per block group
// with gather_once_per_step) and one gradient slot.
void stage3_plan(const ModelShape& m, const ScheduleOptions& o,
                 MemoryPlan& p) {
  const int w = o.world_size;
  const size_t f = sizeof(float);
  size_t owned = 0, largest_partition = 0, largest_block = 0, persistent = 0,
         blocks = 0, persistent_owned = 0;
  const std::vector<Stage3Group> groups =
      stage3_groups(m, o.persistence_threshold);
  const std::vector<bool> kept = stage3_kept_for_backward(
      groups, static_cast<size_t>(o.max_reuse_distance));
  size_t kept_groups = 0, block_groups = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const size_t padded = padded_numel(groups[i].numel, w);
    owned += padded / w;
    largest_partition = std::max(largest_partition, padded / w);
    if (groups[i].persistent) {
      persistent += padded;
      persistent_owned += padded / w;
    } else {
      largest_block = std::max(largest_block, padded);
      blocks += padded;
      ++block_groups;
    }
    if (kept[i]) ++kept_groups;
  }
  // The kept groups are the last blocks: the released ones before them
  // share one slot, which the first kept group then takes.
  const size_t param_slots = std::max<size_t>(
      o.gather_once_per_step ? block_groups : kept_groups, 1);
  const size_t slot = largest_block;
  add(p, "float32 master (parameter partition)", owned * f, Field::kParams,
      true);
  add(p, "gathered block groups (pool)", param_slots * slot * f,
      Field::kParams);
  add(p, "persistent groups' parameters", persistent * f, Field::kParams);
  add(p, "gradient partition (float32)", owned * f, Field::kGrads, true);
  // Note [Reduce once per step]: every group's gradient in its own full
  // storage, all reduced at once (a scratch of the whole partition).
  const bool once = o.reduce_once_per_step;
  add(p, "reduce scratch", (once ? owned : largest_partition) * f,
      Field::kGrads);
  if (once)
    add(p, "block groups' gradients (reduce_once_per_step)", blocks * f,
        Field::kGrads);
  else
    add(p, "gathered group's gradient (pool)", slot * f, Field::kGrads);
  add(p, "persistent groups' gradients", persistent * f, Field::kGrads);
  if (o.dtype == Precision::kBf16) {
    // The model computes with bf16 copies of what is gathered.
    add(p, "gathered block groups, bf16 (pool)", param_slots * slot * 2,
        Field::kParams);
    add(p, "persistent groups' parameters, bf16", persistent * 2,
        Field::kParams);
    if (once)
      add(p, "block groups' gradients, bf16 (reduce_once_per_step)",
          blocks * 2, Field::kGrads);
    else
      add(p, "gathered group's gradient, bf16 (pool)", slot * 2,
          Field::kGrads);
    add(p, "persistent groups' gradients, bf16", persistent * 2,
        Field::kGrads);
  }
  add(p, "optimizer moments", owned * o.optimizer_bytes_per_element,
      Field::kOptimizer, true);
  // Note [Transactional update]: the whole partition only where the update
  // gathers every group; else the persistent groups' partitions.
  add(p,
      o.gather_once_per_step ? "rollback: a spare partition"
                             : "rollback: the persistent groups' spare partitions",
      (o.gather_once_per_step ? owned : persistent_owned) * f,
      Field::kRollback);
  add(p, "rollback: the moments' commit scratch",
      commit_scratch_bytes(owned, o), Field::kRollback);
}

}  // namespace

MemoryPlan memory_plan(const ModelShape& m, const ScheduleOptions& o) {
  check(m, o);
  MemoryPlan p;
  if (o.stage <= 2)
    flat_plan(m, o, p);
  else
    stage3_plan(m, o, p);
  return p;
}

MemoryStats planned_memory(const ModelShape& m, const ScheduleOptions& o) {
  return memory_plan(m, o).stats();
}

}  // namespace zerostep
