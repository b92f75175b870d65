// fused_adam_step against LibTorch, and its determinism across thread
// counts and ISAs. (Against FlatOptimizer's reference loop:
// zero/optimizer_test.cc, since zero/ sits above offload/.)
//
// Tolerances (see the numerical contract in fused_adam.h):
//  * torch::optim::Adam/AdamW: 1e-5 relative over 200 steps, the bound
//    zero/optimizer_test.cc uses for FlatOptimizer, by the same reference
//    run (offload/libtorch_reference.h: LibTorch divides by sqrt(bias2)
//    rather than multiplying by its float reciprocal).
//  * Thread counts and ISAs: bitwise, always.
#include "offload/fused_adam.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "offload/adam_test_vectors.h"
#include "offload/libtorch_reference.h"

namespace zerostep {
namespace {

// The kernel's parameters for 1-based step `step`.
AdamStepParams params_for(AdamStepParams h, int64_t step) {
  h.step = step;
  return h;
}

// `steps` fused steps from AdamState(n, 1) with gradients normal(n, 100 + s)
// scaled by 1 + s % 5 (so the moments see changing magnitudes).
AdamState run_fused(const AdamStepParams& h, size_t n, int steps,
                const FusedAdamOptions& options) {
  AdamState s(n, 1);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> g = normal(n, 100 + step, 1.0f + step % 5);
    fused_adam_step(s.p.data(), g.data(), s.m.data(), s.v.data(), n,
                    params_for(h, step + 1), options);
  }
  return s;
}

template <typename TorchOpt, typename Options>
void check_against_torch(const AdamStepParams& h, Options options) {
  const size_t n = kLibTorchReferenceNumel;
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  EXPECT_LT(
      max_rel_diff_from_libtorch(torch_optimizer<TorchOpt>(options),
                                 [&](float* p, const float* g, int64_t step) {
                                   fused_adam_step(p, g, m.data(), v.data(), n,
                                                   params_for(h, step));
                                 }),
      1e-5);
}

TEST(FusedAdamTest, AdamWMatchesLibTorch) {
  AdamStepParams h;
  h.decoupled = true;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  check_against_torch<torch::optim::AdamW>(
      h, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

TEST(FusedAdamTest, AdamMatchesLibTorch) {
  AdamStepParams h;
  h.decoupled = false;
  h.lr = 1e-2;
  h.weight_decay = 0.01;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  check_against_torch<torch::optim::Adam>(
      h, torch::optim::AdamOptions(1e-2).weight_decay(0.01).betas({0.8, 0.95}));
}

// Without bias correction (DeepSpeed's FusedAdam and CPU Adam with
// optimizer.params.bias_correction false), against the same update in
// double precision: m, v and p over 60 steps of lr 1e-2, on every ISA. The
// first steps differ by a factor of 10 in step size from bias-corrected
// Adam (1 / (1 - 0.9)), so ignoring the flag fails by far more than the
// tolerance (checked at the end).
TEST(FusedAdamTest, WithoutBiasCorrectionMatchesADoubleReference) {
  const size_t n = 1013;
  const int steps = 60;
  for (bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam (L2)");
    AdamStepParams h;
    h.decoupled = decoupled;
    h.lr = 1e-2;
    h.weight_decay = 0.03;
    h.bias_correction = false;
    std::vector<double> p, m(n, 0.0), v(n, 0.0);
    for (float x : normal(n, 1)) p.push_back(x);
    for (int step = 0; step < steps; ++step) {
      const std::vector<float> g = normal(n, 100 + step, 1.0f + step % 5);
      for (size_t i = 0; i < n; ++i) {
        double gi = g[i];
        if (decoupled)
          p[i] *= 1.0 - h.lr * h.weight_decay;
        else
          gi += h.weight_decay * p[i];
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
        p[i] -= h.lr * m[i] / (std::sqrt(v[i]) + h.eps);
      }
    }
    const std::vector<float> want(p.begin(), p.end());
    std::vector<float> first;
    for (Isa isa : every_isa()) {
      if (!fused_adam_isa_supported(isa)) continue;  // its own case skips
      SCOPED_TRACE(fused_adam_isa_name(isa));
      const AdamState s = run_fused(h, n, steps, FusedAdamOptions{2, isa});
      EXPECT_LT(max_rel_diff(s.p, want), 1e-5);
      if (first.empty())
        first = s.p;
      else
        EXPECT_TRUE(bitwise_equal(s.p, first));
    }
    h.bias_correction = true;  // what the flag changes is far from noise
    EXPECT_GT(max_rel_diff(run_fused(h, n, steps, FusedAdamOptions{1}).p, want),
              1e-3);
  }
}

TEST(FusedAdamTest, BitwiseIdenticalAcrossThreadCounts) {
  // Large enough that 7 threads really are 7 (each needs kMinChunk), and
  // not a multiple of the chunk alignment.
  const size_t n = 7 * kMinChunk + 13;
  for (bool decoupled : {true, false}) {
    AdamStepParams h;
    h.decoupled = decoupled;
    h.weight_decay = 0.02;
    const AdamState one = run_fused(h, n, 4, FusedAdamOptions{1, Isa::kAuto});
    for (int threads : {2, 3, 7}) {
      SCOPED_TRACE(threads);
      const AdamState many =
          run_fused(h, n, 4, FusedAdamOptions{threads, Isa::kAuto});
      EXPECT_TRUE(bitwise_equal(many.p, one.p));
      EXPECT_TRUE(bitwise_equal(many.m, one.m));
      EXPECT_TRUE(bitwise_equal(many.v, one.v));
    }
  }
}

// Note [A case per ISA] (offload/adam_test_vectors.h): one case per kernel
// path, skipped with its reason where this CPU lacks it.
class FusedAdamIsaTest : public PerIsaTest {};
INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedAdamIsaTest,
                         ::testing::ValuesIn(every_isa()), isa_case_name);
class FusedAdamMissingIsaTest : public PerMissingIsaTest {};
INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedAdamMissingIsaTest,
                         ::testing::ValuesIn(vector_isas()), isa_case_name);

// Each path (on 3 threads) against the scalar path on one, on sizes around
// the vector widths (8, 16) so that both the full-vector loops and every
// tail length run, and on a size that several threads split.
TEST_P(FusedAdamIsaTest, BitwiseIdenticalToScalar) {
  const Isa isa = GetParam();
  std::vector<size_t> sizes;
  for (size_t n = 1; n <= 40; ++n) sizes.push_back(n);
  sizes.push_back(1000 + 5);
  sizes.push_back(3 * kMinChunk + 7);
  for (bool decoupled : {true, false}) {
    for (double wd : {0.0, 0.03}) {
      AdamStepParams h;
      h.decoupled = decoupled;
      h.weight_decay = wd;
      for (size_t n : sizes) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " wd=" << wd);
        const AdamState scalar =
            run_fused(h, n, 20, FusedAdamOptions{1, Isa::kScalar});
        const AdamState vec = run_fused(h, n, 20, FusedAdamOptions{3, isa});
        ASSERT_TRUE(bitwise_equal(vec.p, scalar.p));
        ASSERT_TRUE(bitwise_equal(vec.m, scalar.m));
        ASSERT_TRUE(bitwise_equal(vec.v, scalar.v));
      }
    }
  }
}

// An ISA this CPU lacks is refused, not run.
TEST_P(FusedAdamMissingIsaTest, RefusesAnIsaTheCpuLacks) {
  std::vector<float> b(4, 1.0f);
  AdamStepParams a;
  EXPECT_THROW(fused_adam_step(b.data(), b.data(), b.data(), b.data(), 1, a,
                               FusedAdamOptions{1, GetParam()}),
               UsageError);
  EXPECT_EQ(b[0], 1.0f);
}

TEST(FusedAdamTest, AutoPicksTheBestIsaAndSaysWhich) {
  std::cout << "fused_adam ISA on this CPU: " << fused_adam_isa() << "\n";
  EXPECT_NE(fused_adam_best_isa(), Isa::kAuto);
  EXPECT_TRUE(fused_adam_isa_supported(fused_adam_best_isa()));
  EXPECT_STREQ(fused_adam_isa(), fused_adam_isa_name(fused_adam_best_isa()));
  if (fused_adam_isa_supported(Isa::kAvx512)) {
    EXPECT_EQ(fused_adam_best_isa(), Isa::kAvx512);
    EXPECT_TRUE(fused_adam_isa_supported(Isa::kAvx2));
  }
}

TEST(FusedAdamTest, EmptySpanIsANoOp) {
  fused_adam_step(nullptr, nullptr, nullptr, nullptr, 0, AdamStepParams());
  fused_adam_step(nullptr, nullptr, nullptr, nullptr, 0, AdamStepParams(),
                  FusedAdamOptions{7, Isa::kAuto});
}

TEST(FusedAdamTest, ZeroParamsAndGradsStayZero) {
  // The padding of a flat buffer must never move.
  for (bool decoupled : {true, false}) {
    std::vector<float> p(37, 0.0f), g(37, 0.0f), m(37, 0.0f), v(37, 0.0f);
    AdamStepParams a;
    a.weight_decay = 0.5;
    a.decoupled = decoupled;
    for (int64_t step = 1; step <= 5; ++step) {
      a.step = step;
      fused_adam_step(p.data(), g.data(), m.data(), v.data(), p.size(), a);
    }
    for (float x : p) EXPECT_EQ(x, 0.0f);
  }
}

TEST(FusedAdamTest, RejectsMisuse) {
  std::vector<float> b(4, 1.0f);
  AdamStepParams a;
  a.step = 0;
  EXPECT_THROW(fused_adam_step(b.data(), b.data(), b.data(), b.data(), 1, a),
               UsageError);
  a.step = 1;
  EXPECT_THROW(fused_adam_step(nullptr, b.data(), b.data(), b.data(), 1, a),
               UsageError);
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// n floats starting at a 64-byte boundary plus `shift` elements, inside a
// vector that owns them (the vector paths stream their stores only to
// aligned outputs: both ways are tested).
class Floats {
 public:
  Floats(const std::vector<float>& init, size_t shift)
      : storage_(init.size() + 16 + shift) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + (64 - at % 64) % 64 / sizeof(float) + shift;
    std::copy(init.begin(), init.end(), data_);
    n_ = init.size();
  }
  float* data() { return data_; }
  std::vector<float> values() const { return {data_, data_ + n_}; }

 private:
  std::vector<float> storage_;
  float* data_;
  size_t n_;
};

// Note [Update out of place]: reading old arrays and writing new ones
// beside them gives the bits of the update in place, on every ISA (a case
// each), thread count and decay, with outputs aligned (streamed stores) or
// not, and leaves the old arrays as they were.
TEST_P(FusedAdamIsaTest, OutOfPlaceIsBitwiseTheUpdateInPlace) {
  const Isa isa = GetParam();
  // 2 * kMinChunk + 37: two threads' chunks and a tail of every vector path.
  for (size_t n : {size_t{37}, 2 * kMinChunk + 37}) {
    for (int threads : {1, 3}) {
      for (int decay = 0; decay < 3; ++decay) {
        for (size_t shift : {0, 1}) {
          SCOPED_TRACE(testing::Message()
                       << "n=" << n << " threads=" << threads
                       << " decay=" << decay << " shift=" << shift);
          AdamStepParams h;
          h.lr = 1e-2;
          h.decoupled = decay == 0;
          h.weight_decay = decay == 2 ? 0.0 : 0.05;
          const FusedAdamOptions o{threads, isa};
          AdamState in_place(n, 7);
          // Two banks of p, m, v, flipped after every step as
          // FlatOptimizer does.
          std::vector<Floats> banks;
          for (int k = 0; k < 6; ++k)
            banks.emplace_back(
                k % 3 == 0 ? in_place.p : std::vector<float>(n, 0.0f), shift);
          for (int step = 1; step <= 4; ++step) {
            const std::vector<float> g = normal(n, 200 + step, 1.0f + step);
            fused_adam_step(in_place.p.data(), g.data(), in_place.m.data(),
                            in_place.v.data(), n, params_for(h, step), o);
            Floats* old = &banks[(step - 1) % 2 * 3];
            Floats* fresh = &banks[step % 2 * 3];
            const std::vector<float> before[3] = {
                old[0].values(), old[1].values(), old[2].values()};
            fused_adam_step(AdamArrays{old[0].data(), fresh[0].data(), g.data(),
                                       old[1].data(), fresh[1].data(),
                                       old[2].data(), fresh[2].data()},
                            n, params_for(h, step), o);
            ASSERT_TRUE(same_bytes(fresh[0].values(), in_place.p));
            ASSERT_TRUE(same_bytes(fresh[1].values(), in_place.m));
            ASSERT_TRUE(same_bytes(fresh[2].values(), in_place.v));
            for (int k = 0; k < 3; ++k)
              ASSERT_TRUE(same_bytes(old[k].values(), before[k]));
          }
        }
      }
    }
  }
}

TEST(FusedAdamTest, RejectsAnOutputOverlappingItsInput) {
  std::vector<float> p(64, 1.0f), g(32, 0.5f), m(32, 0.0f), v(32, 0.0f);
  AdamStepParams a;
  // params_out one element past params_in: neither in place nor apart.
  EXPECT_THROW(fused_adam_step(AdamArrays{p.data(), p.data() + 1, g.data(),
                                          m.data(), m.data(), v.data(),
                                          v.data()},
                               32, a),
               UsageError);
  EXPECT_EQ(p[1], 1.0f);  // refused before anything was written
  // Adjacent but apart is fine.
  EXPECT_NO_THROW(fused_adam_step(AdamArrays{p.data(), p.data() + 32, g.data(),
                                             m.data(), m.data(), v.data(),
                                             v.data()},
                                  32, a));
  EXPECT_EQ(p[0], 1.0f);
}

TEST(FusedAdamTest, ParallelChunksCoverTheSpanOnceOnAlignedBoundaries) {
  for (size_t n : {size_t{1}, size_t{15}, kMinChunk - 1, 2 * kMinChunk + 1,
                   7 * kMinChunk + 13}) {
    for (int threads : {0, 1, 2, 3, 7}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " threads=" << threads);
      std::vector<int> hits(n, 0);
      std::vector<std::pair<size_t, size_t>> chunks;
      std::mutex mu;
      parallel_chunks(n, threads, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) ++hits[i];
        std::lock_guard<std::mutex> lock(mu);
        chunks.emplace_back(begin, end);
      });
      for (int h : hits) ASSERT_EQ(h, 1);
      const size_t want_threads = std::min<size_t>(
          std::max(threads, 1), std::max<size_t>(1, n / kMinChunk));
      EXPECT_EQ(chunks.size(), want_threads);
      for (const auto& c : chunks) {
        EXPECT_EQ(c.first % kChunkAlign, 0u);
        if (c.second != n) {
          EXPECT_EQ(c.second % kChunkAlign, 0u);
          EXPECT_GE(c.second - c.first, kMinChunk);
        }
      }
    }
  }
}

TEST(FusedAdamTest, ParallelChunksRethrowsAWorkersException) {
  EXPECT_THROW(parallel_chunks(4 * kMinChunk, 4,
                               [](size_t begin, size_t) {
                                 if (begin != 0)
                                   throw std::runtime_error("chunk failed");
                               }),
               std::runtime_error);
}

}  // namespace
}  // namespace zerostep
