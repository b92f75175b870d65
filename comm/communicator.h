// Communicator: the collectives zerostep's ZeRO stages need, over flat
// host buffers, behind one small interface. Backends: sim (SimWorld, the
// deterministic in-process simulator), gloo (comm/gloo_world.h, c10d's
// ProcessGroupGloo) and nccl (comm/nccl_communicator.h, built with
// --config=cuda).
//
// Contract for every backend (checked by //comm:conformance):
//   - Collectives are matched across ranks by call order: the k-th
//     collective on every rank is one collective. Every rank must pass the
//     same op, dtype, element count (and root for broadcast). A mismatch is
//     reported as CommError on every rank, never a hang (where the backend
//     can detect it; sim always does).
//   - Calls are blocking: when a call returns, the output buffer holds the
//     result and the input buffer may be reused.
//   - Inputs and outputs may alias where stated (all_reduce is in place;
//     all_gather's input may be the rank's own slice of its output).
//   - A failed collective throws CommError naming the op, its sequence
//     number and the rank(s) at fault; the output buffer is then undefined.
//
// Thread safety: one Communicator object belongs to one rank and is used from
// one thread at a time.
//
// Ownership: buffers are borrowed for the duration of the call only.
#ifndef ZEROSTEP_COMM_COMMUNICATOR_H_
#define ZEROSTEP_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zerostep {

enum class DType : uint8_t { kFloat32, kFloat64, kInt64 };

size_t dtype_size(DType dtype);
const char* to_string(DType dtype);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <>
constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::kInt64; }

// A borrowed, typed, contiguous buffer: host memory, or, with `device`, the
// memory of the device the communicator's ranks compute on (Note [Device
// kernels] in zero/kernels.h). Host-memory backends (sim, gloo) refuse
// device buffers (wrap them in a StagingCommunicator, zero/staging_comm.h);
// NCCL takes both.
struct Buffer {
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::kFloat32;
  bool device = false;

  template <typename T>
  static Buffer of(T* p, size_t n) {
    return Buffer{static_cast<void*>(p), n, dtype_of<T>()};
  }
  size_t bytes() const { return numel * dtype_size(dtype); }
};

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

// Every options struct carries a `label`: an opaque name that a backend
// passes along and the traffic ledger records (comm/ledger.h), so that
// callers can group their collectives; the engine labels each with its
// training phase (zero/phase.h). Backends never match labels across ranks
// (ranks may label one collective differently); sim names them in its error
// messages. A label must be non-null and point to a NUL-terminated string
// with static storage duration (a string literal or a constexpr array):
// ledgers and timelines keep the pointer, not a copy. The defaults keep the
// texts these fields had when they were training phases: "step", and
// "setup" for broadcast and for barrier (kBarrierLabel).
inline constexpr const char kBarrierLabel[] = "setup";

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  const char* label = "step";
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  const char* label = "step";
  // output[i] = output[i] + result[i] instead of output[i] = result[i]:
  // the bits of a reduce-scatter into a scratch buffer followed by adding
  // that buffer into `output`, without the scratch buffer's write and read
  // (the ZeRO stages' per-backward reduce-scatter into the gradient
  // partition). Only where reduce_scatter_accumulates(); other backends
  // refuse it (UsageError).
  bool accumulate = false;
};

struct AllGatherOptions {
  const char* label = "step";
};

struct BroadcastOptions {
  int root = 0;
  const char* label = "setup";
};

// The handle of an asynchronous collective.
//
// wait() blocks until the collective has completed on this rank: the output
// buffer then holds the result and the input buffer may be reused. It throws
// CommError if the collective failed. wait() may be called more than once;
// later calls return at once (or throw the same error). Until wait() has
// returned, the caller must not touch either buffer. Destroying a Work that
// was never waited on is allowed; the collective still completes.
// A backend may complete the collective before the issuing call returns
// (sim does: its virtual clock, not wall time, models the overlap) and may
// raise a failure from the issuing call instead of from wait().
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // A short name for logs: "sim", "gloo", ...
  virtual std::string backend_name() const = 0;

  // In place: every rank's `buf` becomes op(buf of rank 0..W-1).
  virtual void all_reduce(Buffer buf, const AllReduceOptions& opts) = 0;

  // `input` holds W equal chunks of output.numel elements; rank r receives
  // op over ranks of chunk r. input.numel must equal W * output.numel.
  // `output` must not overlap `input`.
  virtual void reduce_scatter(Buffer input, Buffer output,
                              const ReduceScatterOptions& opts) = 0;

  // output.numel must equal W * input.numel; chunk r of every rank's output
  // becomes rank r's input. `input` may be this rank's chunk of `output`.
  virtual void all_gather(Buffer input, Buffer output,
                          const AllGatherOptions& opts) = 0;

  // As reduce_scatter, without blocking (see Work). Asynchronous and
  // blocking collectives are matched across ranks in issue order.
  virtual std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) = 0;

  // As all_gather, without blocking (see Work): `output` holds the result
  // and `input` is the caller's again after wait(). Matched across ranks in
  // issue order with the other collectives. The default runs the blocking
  // all_gather and returns a completed Work; backends that can overlap
  // override it (gloo, nccl).
  virtual std::shared_ptr<Work> all_gather_async(Buffer input, Buffer output,
                                                 const AllGatherOptions& opts);

  // As all_reduce, without blocking (see Work): `buf` is the caller's
  // again after wait(). Matched across ranks in issue order with the other
  // collectives. The default runs the blocking all_reduce and returns a
  // completed Work; backends that can overlap override it.
  virtual std::shared_ptr<Work> all_reduce_async(Buffer buf,
                                                 const AllReduceOptions& opts);

  // Every rank's `buf` becomes root's `buf`.
  virtual void broadcast(Buffer buf, const BroadcastOptions& opts) = 0;

  // Returns when every rank has entered the barrier.
  virtual void barrier() = 0;

  // Whether an asynchronous collective moves its data while the caller goes
  // on (gloo; nccl on device buffers), rather than inside the issuing call
  // (the defaults, sim):
  // what makes issuing one early worth its memory (Note [Stage 3 prefetch]
  // in zero/stage3.h).
  virtual bool overlaps_async() const { return false; }

  // Whether reduce_scatter and reduce_scatter_async take
  // ReduceScatterOptions::accumulate (sim, gloo; wrappers pass it on).
  virtual bool reduce_scatter_accumulates() const { return false; }

  // Whether buffers marked `device` may be given as they are (NCCL), also
  // beside a host buffer in one collective (stage 3's offload from a
  // device gathers host partitions into device storage); otherwise only
  // host buffers (Buffer, check_host_buffer).
  virtual bool reads_device_memory() const { return false; }
};

// Argument checks every backend applies before a collective: UsageError
// naming the rank and the rule.
void check_reduce_scatter_args(int rank, int world_size, Buffer input,
                               Buffer output);
void check_all_gather_args(int rank, int world_size, Buffer input,
                           Buffer output);
void check_broadcast_root(int root, int world_size);
// For backends without reduce_scatter_accumulates(): UsageError naming the
// backend when opts.accumulate is set.
void refuse_accumulate(const std::string& backend, int rank,
                       const ReduceScatterOptions& opts);
// For backends that read host memory only (sim, gloo): UsageError naming
// the backend and the fix when `b` is device memory.
void check_host_buffer(const std::string& backend, int rank, Buffer b);

// A Work that is already complete: for backends that finish a collective
// inside the issuing call.
class CompletedWork final : public Work {
 public:
  void wait() override {}
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_COMMUNICATOR_H_
