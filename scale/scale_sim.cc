#include "scale/scale_sim.h"

#include <memory>

#include "common/errors.h"
#include "sim/shape_only_comm.h"

namespace zerostep {
namespace {

struct Preset {
  const char* name;
  size_t vocab, dim, layers, ffn, kv_dim;
};

// Llama-2 shapes; 70B uses grouped-query attention (8 key/value heads).
constexpr Preset kPresets[] = {
    {"1.3B", 32000, 2048, 24, 5504, 2048},
    {"7B", 32000, 4096, 32, 11008, 4096},
    {"13B", 32000, 5120, 40, 13824, 5120},
    {"70B", 32000, 8192, 80, 28672, 1024},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

ModelShape model_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelShape m;
    m.name = name;
    auto add = [&](size_t numel, int block) {
      m.numels.push_back(numel);
      m.block.push_back(block);
    };
    int block = 0;
    add(p.vocab * p.dim, block++);  // token embedding
    for (size_t l = 0; l < p.layers; ++l) {
      const int b = block++;
      add(p.dim, b);             // attention norm (persistent: small)
      add(p.dim * p.dim, b);     // q
      add(p.dim * p.kv_dim, b);  // k
      add(p.dim * p.kv_dim, b);  // v
      add(p.dim * p.dim, b);     // o
      add(p.dim, b);             // mlp norm
      add(p.dim * p.ffn, b);     // gate
      add(p.dim * p.ffn, b);     // up
      add(p.ffn * p.dim, b);     // down
    }
    add(p.dim, -1);                 // final norm
    add(p.vocab * p.dim, block++);  // output head
    m.num_blocks = block;
    return m;
  }
  std::string names;
  for (const std::string& n : model_preset_names())
    names += (names.empty() ? "" : ", ") + n;
  throw UsageError("model preset '" + name + "' is not one of " + names);
}

ScaleReport simulate_scale(const ModelShape& model,
                           const ScaleOptions& options) {
  const ScheduleOptions& so = options.schedule;
  const std::vector<ScheduleEvent> events = window_schedule(model, so);
  const int w = so.world_size;
  ShapeOnlyCommunicator comm(w, options.cost);
  Ledger ledger;
  RecordingCommunicator rec(&comm, &ledger);
  ScaleReport r;
  r.options = options;
  r.model = model.name;
  r.params = static_cast<double>(model.numel());
  std::vector<std::shared_ptr<Work>> works(events.size());
  const double tokens = options.tokens_per_micro_batch;
  for (size_t i = 0; i < events.size(); ++i) {
    const ScheduleEvent& e = events[i];
    switch (e.type) {
      case ScheduleEvent::Type::kCompute: {
        double s = 0.0;
        switch (e.work) {
          case ScheduleEvent::Work::kForward:
            s = options.cost.forward_seconds(e.params, tokens);
            break;
          case ScheduleEvent::Work::kBackward:
            s = options.cost.backward_seconds(e.params, tokens);
            break;
          case ScheduleEvent::Work::kOptimizer:
            s = options.cost.optimizer_seconds(e.params);
            break;
        }
        comm.compute(s);
        r.compute_s += s;
        break;
      }
      case ScheduleEvent::Type::kWait:
        ZS_CHECK(works[e.waits_for] != nullptr);
        works[e.waits_for]->wait();
        break;
      case ScheduleEvent::Type::kCollective: {
        const size_t n = e.numel, part = e.numel / static_cast<size_t>(w);
        const Buffer full{nullptr, n, e.dtype};
        const Buffer one{nullptr, part, e.dtype};
        switch (e.kind) {
          case CollectiveKind::kAllReduce:
            if (e.async)
              works[i] = rec.all_reduce_async(full, {e.op, e.phase});
            else
              rec.all_reduce(full, {e.op, e.phase});
            break;
          case CollectiveKind::kReduceScatter:
            if (e.async)
              works[i] = rec.reduce_scatter_async(full, one, {e.op, e.phase});
            else
              rec.reduce_scatter(full, one, {e.op, e.phase});
            break;
          case CollectiveKind::kAllGather:
            if (e.async)
              works[i] = rec.all_gather_async(one, full, {e.phase});
            else
              rec.all_gather(one, full, {e.phase});
            break;
          case CollectiveKind::kBroadcast:
            rec.broadcast(full, {0, e.phase});
            break;
          case CollectiveKind::kBarrier:
            rec.barrier();
            break;
        }
        break;
      }
    }
  }
  r.step_s = comm.clock().now_s;
  r.comm_s = comm.clock().comm_s;
  r.exposed_comm_s = comm.clock().exposed_comm_s;
  r.ledger = ledger.entries();
  r.bytes_per_rank = ledger.total_bytes();
  r.wire_bytes_per_rank = ledger.total_wire_bytes();
  for (const LedgerEntry& e : r.ledger)
    r.bytes_by_collective[std::string(to_string(e.kind)) + "/" + e.label] +=
        e.bytes;
  r.memory = planned_memory(model, so);
  return r;
}

}  // namespace zerostep
