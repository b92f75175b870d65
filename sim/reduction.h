// Reduction: how the simulator moves one collective's data between the
// ranks' buffers once every rank has arrived. Pure functions of the buffers:
// no clock, no faults, no threads of their own (the simulator may run the
// parts of one reduction on several threads, below). Reductions run
// elementwise in rank order (Note [Reduction order] in sim/sim_world.h),
// so the result is the same bits whatever the order the ranks arrived in,
// and every rank receives the same bits.
//
// Arguments are one Buffer per rank, indexed by rank. The caller has
// checked that the ranks agree (same dtype on every buffer, and the counts
// each function states); these functions do not check it again. A
// `scratch` vector is working memory that the functions grow and never
// shrink, so that repeated collectives do not allocate.
//
// Thread safety: the caller gives exclusive use of every buffer and of
// `scratch` for the duration of a call; the one exception is that distinct
// parts of one reduction (reduce_part_in_rank_order) may run at once, each
// with its own scratch.
#ifndef ZEROSTEP_SIM_REDUCTION_H_
#define ZEROSTEP_SIM_REDUCTION_H_

#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"

namespace zerostep {

// In place: every bufs[r] becomes op(bufs[0], ..., bufs[W-1]). All buffers
// hold the same number of elements.
void all_reduce_in_rank_order(const std::vector<Buffer>& bufs, ReduceOp op,
                              std::vector<unsigned char>* scratch);

// outputs[r] becomes op over the ranks of chunk r of their inputs (with
// `accumulate`, outputs[r] + that: ReduceScatterOptions::accumulate). Every
// input holds W * n elements, every output n; no output overlaps an input.
// `scratch` (a piece of the fold, with `accumulate`): nullptr for a
// buffer of its own.
void reduce_scatter_in_rank_order(
    const std::vector<Buffer>& inputs, const std::vector<Buffer>& outputs,
    ReduceOp op, bool accumulate = false,
    std::vector<unsigned char>* scratch = nullptr);

// Parallel reduction (Note [Parallel reduction] in sim/reduction.cc): an
// all-reduce or reduce-scatter cut into parts that read and write disjoint
// elements. Running every part in [0, reduction_parts()) once, on any
// threads, at once or in any order, gives the same bits as
// move_collective_data. Each concurrent caller passes its own `scratch`.
//
// How many parts; 1 for a collective too small to be worth splitting, and
// for every other kind (which are not split).
size_t reduction_parts(CollectiveKind kind, const std::vector<Buffer>& inputs,
                       const std::vector<Buffer>& outputs);
// Part `part` of an all-reduce (in place on `inputs`; `outputs` ignored)
// or a reduce-scatter.
void reduce_part_in_rank_order(CollectiveKind kind, ReduceOp op,
                               const std::vector<Buffer>& inputs,
                               const std::vector<Buffer>& outputs, size_t part,
                               std::vector<unsigned char>* scratch,
                               bool accumulate = false);

// Every outputs[r] becomes inputs[0], ..., inputs[W-1] concatenated. Every
// input holds n elements, every output W * n; an input may be its own
// rank's chunk of its output.
void all_gather_in_rank_order(const std::vector<Buffer>& inputs,
                              const std::vector<Buffer>& outputs,
                              std::vector<unsigned char>* scratch);

// Every bufs[r] with r != root becomes bufs[root]; root's is not written.
void broadcast_from_root(const std::vector<Buffer>& bufs, int root);

// The data movement of collective `kind` (one of the above; a barrier moves
// nothing). all_reduce and broadcast are in place: they use `inputs` and
// ignore `outputs`. `op` applies to the reductions, `root` to broadcast,
// `accumulate` to a reduce-scatter (reduce_scatter_in_rank_order).
void move_collective_data(CollectiveKind kind, ReduceOp op, int root,
                          const std::vector<Buffer>& inputs,
                          const std::vector<Buffer>& outputs,
                          std::vector<unsigned char>* scratch,
                          bool accumulate = false);

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_REDUCTION_H_
