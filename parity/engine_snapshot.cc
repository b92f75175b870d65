#include "parity/engine_snapshot.h"

#include <cstring>

#include "engine/engine.h"
#include "parity/scenario.h"

namespace zerostep {

bool EngineSnapshot::operator==(const EngineSnapshot& o) const {
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  bool live_same = live.size() == o.live.size();
  for (size_t i = 0; live_same && i < live.size(); ++i)
    if (!live[i].empty() && !o.live[i].empty())
      live_same = same(live[i], o.live[i]);
  return live_same && same(params, o.params) && same(exp_avg, o.exp_avg) &&
         same(exp_avg_sq, o.exp_avg_sq) &&
         optimizer_steps == o.optimizer_steps &&
         global_steps == o.global_steps && global_samples == o.global_samples &&
         micro_steps == o.micro_steps && lr == o.lr;
}

std::string EngineSnapshot::digest() const {
  std::string bytes;
  auto add = [&](const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
  };
  add(params.data(), params.size() * sizeof(float));
  add(exp_avg.data(), exp_avg.size() * sizeof(float));
  add(exp_avg_sq.data(), exp_avg_sq.size() * sizeof(float));
  for (int64_t c : {optimizer_steps, global_steps, global_samples, micro_steps})
    add(&c, sizeof(c));
  add(&lr, sizeof(lr));
  return fnv1a_hex(bytes.data(), bytes.size());
}

EngineSnapshot capture_engine_snapshot(Engine& e) {
  EngineSnapshot s;
  // What a failed call must leave as it was (Note [Transactional update]
  // in zero/stage.h): stages 0-1 in float32 the whole replica; stage 2 and
  // bf16's partitioned master the rank's own partition, which is what
  // checkpoints save (the replica's chunks owned by other ranks may hold
  // the update).
  const int stage = e.config().zero.stage;
  if (stage == 0 || (stage == 1 && e.dtype() != Precision::kBf16)) {
    torch::Tensor p = e.flat_parameters().contiguous();
    s.params.assign(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  } else if (stage < 3) {
    s.params = e.owned_parameters();
  } else {
    s.params = e.owned_parameters();
    // Persistent parameters are whole (live storage); the others are
    // released between uses and live in the partition.
    for (const torch::Tensor& p : e.parameters()) {
      s.live.emplace_back();
      if (p.storage().nbytes() <
          static_cast<size_t>(p.storage_offset() + p.numel()) * sizeof(float))
        continue;
      torch::Tensor c = p.contiguous();
      s.live.back().assign(c.data_ptr<float>(),
                           c.data_ptr<float>() + c.numel());
    }
  }
  s.exp_avg = e.optimizer().exp_avg();
  s.exp_avg_sq = e.optimizer().exp_avg_sq();
  s.optimizer_steps = e.optimizer().step_count();
  s.global_steps = e.global_steps();
  s.global_samples = e.global_samples();
  s.micro_steps = e.micro_steps();
  s.lr = e.get_lr();
  return s;
}

}  // namespace zerostep
