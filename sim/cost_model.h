// CostModel: the alpha-beta-gamma model that charges virtual time to each
// collective of the simulator, and to modelled compute.
//
// Note [Cost model]
// ~~~~~~~~~~~~~~~~~
// A collective over p ranks whose payload is n bytes (the ledger's `bytes`:
// the all-reduce buffer, the reduce-scatter input, the all-gather output,
// the broadcast buffer; comm/ledger.h) costs, with the ring algorithm:
//
//   all_reduce      2(p-1)α + 2((p-1)/p)·n·β + ((p-1)/p)·n·γ
//   reduce_scatter   (p-1)α +  ((p-1)/p)·n·β + ((p-1)/p)·n·γ
//   all_gather       (p-1)α +  ((p-1)/p)·n·β
//   broadcast       ⌈log2 p⌉·(α + n·β)          (binomial tree)
//   barrier         ⌈log2 p⌉·α                  (dissemination)
//
// and nothing when p = 1. α is the per-message latency, β the seconds per
// byte of the slowest link the ring crosses, γ the seconds per byte of
// reduction arithmetic. reduce_scatter carries the γ term because it
// reduces: reduce_scatter + all_gather is then exactly the ring all-reduce.
//
// Two-level topology: ranks are placed node by node, `ranks_per_node` to a
// node. A ring that stays inside one node (p <= ranks_per_node) runs at
// the intra-node bandwidth; a ring over several nodes is bound by its
// inter-node links (β = 1 / inter_node_bytes_per_s). Hierarchical
// algorithms (NCCL's tree, two-level rings) are not modelled.
//
// Compute: a forward pass over a model of N parameters costs 2·N FLOPs per
// token and a backward 4·N (the usual dense-matmul count; attention's
// quadratic term is left out), charged at `flops_per_s`. The optimizer is
// bandwidth-bound: 28 bytes per owned parameter (fused Adam reads
// param, grad, m, v and writes param, m, v) at `memory_bytes_per_s`.
//
// The defaults describe an H100-class cluster: 8 GPUs per node on NVLink,
// one 200 Gb/s NIC per GPU. They are a documented starting point, not a
// measurement; every field can be set (tools/harness --help).
//
// Thread safety: a value type; the functions are pure.
#ifndef ZEROSTEP_SIM_COST_MODEL_H_
#define ZEROSTEP_SIM_COST_MODEL_H_

#include <cstdint>
#include <string>

#include "comm/ledger.h"

namespace zerostep {

struct CostModel {
  // α: seconds per message (launch and hop latency). Default 5 µs.
  double alpha_s = 5e-6;
  // γ: seconds per byte reduced. Default 1 / (400 GB/s).
  double gamma_s_per_byte = 1.0 / 400e9;
  // Ranks that share a node (and its fast links). Default 8.
  int ranks_per_node = 8;
  // Ring bandwidth inside a node. Default 150 GB/s (NVLink).
  double intra_node_bytes_per_s = 150e9;
  // Ring bandwidth across nodes, per rank. Default 25 GB/s (200 Gb/s).
  double inter_node_bytes_per_s = 25e9;
  // Compute rate for modelled FLOPs. Default 400 TFLOP/s (an H100's
  // 989 TFLOP/s dense bf16 at 40% utilisation).
  double flops_per_s = 400e12;
  // Memory bandwidth for the optimizer. Default 2 TB/s.
  double memory_bytes_per_s = 2e12;

  // β for a ring over `world_size` ranks (Note [Cost model]).
  double beta_s_per_byte(int world_size) const;
  // Virtual seconds of one collective of `bytes` payload over `world_size`
  // ranks. 0 for world_size 1.
  double collective_seconds(CollectiveKind kind, uint64_t bytes,
                            int world_size) const;
  // Forward / backward of `params` parameters over `tokens` tokens.
  double forward_seconds(double params, double tokens) const;
  double backward_seconds(double params, double tokens) const;
  // One optimizer step over `owned_params` parameters.
  double optimizer_seconds(double owned_params) const;

  // "alpha_s=5e-06 gamma_s_per_byte=... ranks_per_node=8 ...": every field.
  std::string to_string() const;
};

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_COST_MODEL_H_
