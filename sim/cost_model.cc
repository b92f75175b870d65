#include "sim/cost_model.h"

#include <cmath>
#include <sstream>

namespace zerostep {
namespace {

int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

}  // namespace

double CostModel::beta_s_per_byte(int world_size) const {
  return world_size <= ranks_per_node ? 1.0 / intra_node_bytes_per_s
                                      : 1.0 / inter_node_bytes_per_s;
}

double CostModel::collective_seconds(CollectiveKind kind, uint64_t bytes,
                                     int world_size) const {
  if (world_size <= 1) return 0.0;
  const double p = world_size;
  const double n = static_cast<double>(bytes);
  const double beta = beta_s_per_byte(world_size);
  const double share = (p - 1) / p;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2 * (p - 1) * alpha_s + 2 * share * n * beta +
             share * n * gamma_s_per_byte;
    case CollectiveKind::kReduceScatter:
      return (p - 1) * alpha_s + share * n * beta +
             share * n * gamma_s_per_byte;
    case CollectiveKind::kAllGather:
      return (p - 1) * alpha_s + share * n * beta;
    case CollectiveKind::kBroadcast:
      return ceil_log2(world_size) * (alpha_s + n * beta);
    case CollectiveKind::kBarrier:
      return ceil_log2(world_size) * alpha_s;
  }
  return 0.0;
}

double CostModel::forward_seconds(double params, double tokens) const {
  return 2.0 * params * tokens / flops_per_s;
}

double CostModel::backward_seconds(double params, double tokens) const {
  return 4.0 * params * tokens / flops_per_s;
}

double CostModel::optimizer_seconds(double owned_params) const {
  return 28.0 * owned_params / memory_bytes_per_s;
}

std::string CostModel::to_string() const {
  std::ostringstream os;
  os << "alpha_s=" << alpha_s << " gamma_s_per_byte=" << gamma_s_per_byte
     << " ranks_per_node=" << ranks_per_node
     << " intra_node_bytes_per_s=" << intra_node_bytes_per_s
     << " inter_node_bytes_per_s=" << inter_node_bytes_per_s
     << " flops_per_s=" << flops_per_s
     << " memory_bytes_per_s=" << memory_bytes_per_s;
  return os.str();
}

}  // namespace zerostep
