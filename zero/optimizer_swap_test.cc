// FlatOptimizer with its state on a BlockDevice (Note [NVMe optimizer
// state]): the same bits as in memory, and all-or-nothing under faults.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/swap_store.h"
#include "offload/faulty_block_device.h"
#include "offload/memory_block_device.h"
#include "zero/optimizer.h"

namespace zerostep {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

OptimizerHyper hyper_of(OptimizerKind kind) {
  OptimizerHyper h;
  h.kind = kind;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.momentum = kind == OptimizerKind::kSGD ? 0.9 : 0.0;
  return h;
}

// Swapped in sub-groups that do not divide the length, with 3 and 5
// buffers, every optimizer kind gives the in-memory optimizer's bits.
TEST(OptimizerSwapTest, SameBitsAsInMemory) {
  const size_t n = 10000;
  for (OptimizerKind kind :
       {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSGD})
    for (size_t buffers : {3, 5}) {
      const OptimizerHyper h = hyper_of(kind);
      MemoryBlockDevice dev("mem://opt");
      FlatOptimizer mem(h, n);
      FlatOptimizer swp(h, n, AdamKernel::kFused, {&dev, 1536, 2 * buffers});
      ASSERT_TRUE(swp.swapped());
      EXPECT_EQ(swp.swap_store()->num_subgroups(), 7u);
      std::vector<float> a = random_vector(n, 1, 1.0f), b = a;
      for (int step = 0; step < 5; ++step) {
        const std::vector<float> g = random_vector(n, 10 + step, 0.1f);
        mem.step(a.data(), g.data(), h);
        swp.step(b.data(), g.data(), h);
        swp.commit();
      }
      // Memory: the store's buffers, not the moments.
      EXPECT_EQ(swp.state_bytes(), swp.swap_store()->buffer_bytes());
      EXPECT_TRUE(same_bits(a, b));
      EXPECT_TRUE(same_bits(mem.exp_avg(), swp.exp_avg()));
      EXPECT_TRUE(same_bits(mem.exp_avg_sq(), swp.exp_avg_sq()));
      EXPECT_EQ(swp.step_count(), 5);
      // A read of the moments is the caller's copy: nothing stays held.
      EXPECT_EQ(swp.state_bytes(), swp.swap_store()->buffer_bytes());
      const std::vector<float> g = random_vector(n, 99, 0.1f);
      mem.step(a.data(), g.data(), h);
      swp.step(b.data(), g.data(), h);
      swp.commit();
      EXPECT_EQ(swp.state_bytes(), swp.swap_store()->buffer_bytes());
      EXPECT_TRUE(same_bits(a, b));
    }
}

// A device fault at any operation of a step, or a failure after it (the
// caller's collective), leaves the moments and the step count as they were
// once the caller restores (as the stages do: their own copy of the
// parameters, FlatOptimizer::restore); the retried step then gives the
// fault-free run's bits.
TEST(OptimizerSwapTest, AFaultAnywhereInAStepChangesNothing) {
  const size_t n = 5000;
  const OptimizerHyper h = hyper_of(OptimizerKind::kAdamW);
  const std::vector<float> g0 = random_vector(n, 3, 0.1f);
  const std::vector<float> g1 = random_vector(n, 4, 0.1f);
  // The fault-free reference.
  FlatOptimizer ref(h, n);
  std::vector<float> want = random_vector(n, 2, 1.0f);
  ref.step(want.data(), g0.data(), h);
  const std::vector<float> want_before = want;
  ref.step(want.data(), g1.data(), h);

  int faults_seen = 0;
  for (IoFaultKind fault : {IoFaultKind::kIoError, IoFaultKind::kShortWrite,
                          IoFaultKind::kNoSpace, IoFaultKind::kTornWrite})
    for (OpKind op : {OpKind::kRead, OpKind::kWrite, OpKind::kFlush}) {
      if (!fault_applies(fault, op)) continue;
      for (uint64_t k = 0; k < 12; ++k) {
        MemoryBlockDevice mem("mem://opt");
        FaultyBlockDevice dev(&mem, {});
        FlatOptimizer opt(h, n, AdamKernel::kFused, {&dev, 1024, 4});
        std::vector<float> p = random_vector(n, 2, 1.0f);
        opt.step(p.data(), g0.data(), h);
        opt.commit();
        ASSERT_TRUE(same_bits(p, want_before));
        const std::vector<float> m = opt.exp_avg(), v = opt.exp_avg_sq();
        FlatOptimizer::Snapshot saved;
        opt.save(&saved);
        const std::vector<float> p_saved = p;
        dev.schedule(op, dev.count(op) + k, fault);
        bool failed = false;
        try {
          opt.step(p.data(), g1.data(), h);
          opt.commit();
        } catch (const IoError& e) {
          failed = true;
          ++faults_seen;
          EXPECT_NE(std::string(e.what()).find("mem://opt"), std::string::npos)
              << e.what();
        }
        if (!failed) continue;  // the step had fewer such operations
        opt.restore(saved);
        p = p_saved;
        if (dev.crashed()) continue;  // the device is gone with the process
        EXPECT_EQ(opt.step_count(), 1);
        EXPECT_TRUE(same_bits(opt.exp_avg(), m)) << dev.describe();
        EXPECT_TRUE(same_bits(opt.exp_avg_sq(), v)) << dev.describe();
        opt.step(p.data(), g1.data(), h);  // retried: as if nothing happened
        opt.commit();
        EXPECT_TRUE(same_bits(p, want)) << dev.describe();
      }
    }
  EXPECT_GT(faults_seen, 20);
}

// The caller's collective fails after a successful step: restore() drops
// the prepared moments.
TEST(OptimizerSwapTest, RestoreAfterAPreparedStepDropsIt) {
  const size_t n = 3000;
  const OptimizerHyper h = hyper_of(OptimizerKind::kAdam);
  MemoryBlockDevice dev("mem://opt");
  FlatOptimizer opt(h, n, AdamKernel::kFused, {&dev, 700, 4});
  FlatOptimizer ref(h, n);
  std::vector<float> p = random_vector(n, 5, 1.0f), q = p;
  const std::vector<float> g = random_vector(n, 6, 0.1f);
  FlatOptimizer::Snapshot saved;
  opt.save(&saved);
  opt.step(p.data(), g.data(), h);
  EXPECT_THROW(opt.exp_avg(), UsageError);  // undecided
  opt.restore(saved);
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_TRUE(same_bits(opt.exp_avg(), std::vector<float>(n, 0.0f)));
  p = q;
  opt.step(p.data(), g.data(), h);
  opt.commit();
  ref.step(q.data(), g.data(), h);
  EXPECT_TRUE(same_bits(p, q));
  EXPECT_TRUE(same_bits(opt.exp_avg_sq(), ref.exp_avg_sq()));
}

TEST(OptimizerSwapTest, LoadStateGoesToTheDevice) {
  const size_t n = 3000;
  const OptimizerHyper h = hyper_of(OptimizerKind::kAdamW);
  MemoryBlockDevice dev("mem://opt");
  FlatOptimizer a(h, n);
  FlatOptimizer b(h, n, AdamKernel::kFused, {&dev, 1000, 4});
  std::vector<float> pa = random_vector(n, 5, 1.0f);
  const std::vector<float> g = random_vector(n, 6, 0.1f);
  a.step(pa.data(), g.data(), h);
  b.load_state(a.step_count(), a.exp_avg(), a.exp_avg_sq());
  EXPECT_TRUE(same_bits(b.exp_avg(), a.exp_avg()));
  std::vector<float> pb = pa;
  a.step(pa.data(), g.data(), h);
  b.step(pb.data(), g.data(), h);
  b.commit();
  EXPECT_TRUE(same_bits(pa, pb));
  EXPECT_THROW(b.load_state(1, std::vector<float>(n - 1), a.exp_avg_sq()),
               UsageError);
}

}  // namespace
}  // namespace zerostep
