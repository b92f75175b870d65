#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "comm/ledger.h"
#include "common/errors.h"
#include "common/log_capture.h"
#include "engine/engine_test_util.h"
#include "models/mlp.h"
#include "models/task.h"
#include "sim/sim_world.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

std::string config_json(int stage, bool managed, int gas,
                        const std::string& extra = "") {
  return "{\"train_micro_batch_size_per_gpu\": 2, "
         "\"gradient_accumulation_steps\": " +
         std::to_string(gas) + ", \"managed_gradient_accumulation\": " +
         (managed ? "true" : "false") +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}" +
         extra + "}";
}

// A world of `w` ranks, each with an mlp replica and its data, configured
// by config_json.
struct Fixture : MlpWorld {
  Fixture(int w, int stage, bool managed, int gas = 4)
      : MlpWorld(w, parse_config(config_json(stage, managed, gas), w)) {}
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(EngineTest, UnmanagedRejectsSetBoundaryAndChangesNothing) {
  Fixture fx(1, 0, /*managed=*/false);
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    e.backward(fx.loss(r, 0));
    std::string msg =
        message_of([&] { e.set_gradient_accumulation_boundary(true); });
    EXPECT_NE(msg.find("set_gradient_accumulation_boundary() is not allowed "
                       "with managed_gradient_accumulation = false"),
              std::string::npos)
        << msg;
    EXPECT_FALSE(e.is_gradient_accumulation_boundary());
    EXPECT_EQ(e.window_backwards(), 1);
    e.step();
    EXPECT_TRUE(e.was_step_applied());
  });
}

TEST(EngineTest, StepWithNoBackwardIsAnErrorThatChangesNothing) {
  for (int stage : {0, 1}) {
    Fixture fx(2, stage, /*managed=*/false);
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      e.backward(fx.loss(r, 0));
      e.step();
      torch::Tensor before = e.flat_parameters().clone();
      const uint64_t bytes = fx.world->ledger(r).total_bytes();
      std::string msg = message_of([&] { e.step(); });
      EXPECT_NE(msg.find("no backward() since the last step"),
                std::string::npos)
          << msg;
      EXPECT_TRUE(torch::equal(before, e.flat_parameters()));
      EXPECT_EQ(e.global_steps(), 1);
      EXPECT_EQ(e.global_samples(), 2 * 2);
      EXPECT_EQ(fx.world->ledger(r).total_bytes(), bytes);  // no collective
      // The engine is still usable.
      e.backward(fx.loss(r, 1));
      e.step();
      EXPECT_EQ(e.global_steps(), 2);
    });
  }
}

TEST(EngineTest, RanksThatDisagreeOnNGetAnErrorOnEveryRankAndNoUpdate) {
  for (int stage : {0, 1, 2, 3}) {
    Fixture fx(3, stage, /*managed=*/false);
    std::vector<torch::Tensor> before(3), after(3);
    // Stage 3 keeps only partitions: compare what the optimizer owns.
    auto snapshot = [&](Engine& e) {
      return stage < 3 ? e.flat_parameters().clone()
                       : torch::tensor(e.optimizer().exp_avg());
    };
    auto errors = fx.world->run_collect([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      before[r] = snapshot(e);
      const int n = r == 1 ? 3 : 2;  // rank 1 runs one backward too many
      try {
        for (int i = 0; i < n; ++i) e.backward(fx.loss(r, i));
        e.step();
      } catch (...) {
        after[r] = snapshot(e);
        EXPECT_EQ(e.global_steps(), 0);
        EXPECT_FALSE(e.is_gradient_accumulation_boundary());
        throw;
      }
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(errors[r]) << "stage " << stage << " rank " << r;
      std::string msg = message_of([&] { std::rethrow_exception(errors[r]); });
      EXPECT_NE(msg.find("ranks disagree on the accumulation window"),
                std::string::npos)
          << msg;
      // Stages 0/1 meet at step(); stage 2 reduces in backward, so rank 1's
      // third backward meets the others' step().
      const char* rank1 = stage < 2 ? "rank 1 ran 3 backward() calls"
                                    : "rank 1 starts backward() number 3";
      EXPECT_NE(msg.find(rank1), std::string::npos) << msg;
      ASSERT_TRUE(after[r].defined()) << "stage " << stage << " rank " << r;
      EXPECT_TRUE(torch::equal(before[r], after[r])) << "rank " << r;
    }
  }
}

// Note [Window agreement] (zero/stage.h): a backward that communicates
// nothing skips its agreement: stage 2 with reduce_once_per_step, stage 3
// with it when every block group is gathered as the backward begins (kept
// by gather_once_per_step, or by the reuse distance). Where the backward
// gathers (stage 3 with reuse distance 0) or reduces (the default), it
// still agrees. A rank that runs one backward too many is then caught by
// the step's agreement, before anything is reduced: the same error on
// every rank, and neither parameters nor moments move.
TEST(EngineTest, ABackwardThatCommunicatesNothingSkipsItsAgreement) {
  struct Case {
    int stage;
    std::string zero;
    int agreements;  // rank 0's, in the backward calls of two windows of 2
    bool disagree;   // also run the extra backward
  };
  const std::string s3 = "\"stage3_param_persistence_threshold\": 0, ";
  const std::vector<Case> cases = {
      {2, "\"reduce_once_per_step\": true", 0, true},
      {3, s3 + "\"reduce_once_per_step\": true, \"gather_once_per_step\": true",
       0, true},
      {3, s3 + "\"reduce_once_per_step\": true", 0, false},
      {3,
       s3 + "\"reduce_once_per_step\": true, \"stage3_max_reuse_distance\": 0",
       4, false},
      {3, s3 + "\"gather_once_per_step\": true", 4, false},
      {2, "\"reduce_once_per_step\": false", 4, false},
  };
  const int w = 3;
  for (const Case& c : cases) {
    const std::string what = "stage " + std::to_string(c.stage) + " " + c.zero;
    const Config config = parse_config(
        "{\"train_micro_batch_size_per_gpu\": 2, "
        "\"gradient_accumulation_steps\": 2, "
        "\"managed_gradient_accumulation\": false, \"zero_optimization\": "
        "{\"stage\": " +
            std::to_string(c.stage) + ", " + c.zero + "}}",
        w);
    MlpWorld fx(w, config);
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      for (int k = 0; k < 2; ++k) {
        for (int b = 0; b < 2; ++b) e.backward(fx.loss(r, 2 * k + b));
        e.step();
      }
    });
    size_t agreements = 0;  // Note [Window agreement]: 3 int64 per rank
    for (const LedgerEntry& l : fx.world->ledger(0).entries())
      agreements += l.kind == CollectiveKind::kAllGather &&
                    l.dtype == DType::kInt64 &&
                    std::string_view(l.label) == phase::kBackward;
    EXPECT_EQ(agreements, static_cast<size_t>(c.agreements)) << what;
    if (!c.disagree) continue;
    MlpWorld bad(w, config);
    auto errors = bad.world->run_collect([&](int r) {
      Engine e(bad.models[r], bad.config, &bad.world->comm(r));
      for (int b = 0; b < 2; ++b) e.backward(bad.loss(r, b));
      e.step();
      const std::vector<float> moments = e.optimizer().exp_avg();
      const std::vector<float> owned = e.owned_parameters();
      try {
        const int n = r == 1 ? 3 : 2;  // rank 1 runs one backward too many
        for (int b = 0; b < n; ++b) e.backward(bad.loss(r, 2 + b));
        e.step();
      } catch (...) {
        EXPECT_EQ(e.optimizer().exp_avg(), moments) << what << " rank " << r;
        EXPECT_EQ(e.owned_parameters(), owned) << what << " rank " << r;
        EXPECT_EQ(e.global_steps(), 1) << what;
        throw;
      }
    });
    for (int r = 0; r < w; ++r) {
      ASSERT_TRUE(errors[r]) << what << " rank " << r;
      const std::string msg =
          message_of([&] { std::rethrow_exception(errors[r]); });
      EXPECT_NE(msg.find("rank 1 ran 3 backward() calls and steps"),
                std::string::npos)
          << what << ": " << msg;
      EXPECT_NE(msg.find("rank 0 ran 2 backward() calls and steps"),
                std::string::npos)
          << what << ": " << msg;
    }
  }
}

// A Communicator decorator that records the engine's boundary flag each time
// the engine communicates: the flag must be true exactly during step().
class BoundarySpy final : public Communicator {
 public:
  BoundarySpy(Communicator* inner) : inner_(inner) {}
  const Engine* engine = nullptr;
  std::vector<std::pair<std::string, bool>> seen;  // label, flag
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "spy"; }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    note(o.label);
    inner_->all_reduce(b, o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    note(o.label);
    inner_->reduce_scatter(i, out, o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    note(o.label);
    return inner_->reduce_scatter_async(i, out, o);
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    note(o.label);
    inner_->all_gather(i, out, o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    inner_->broadcast(b, o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  void note(const char* label) {
    if (engine)
      seen.push_back({label, engine->is_gradient_accumulation_boundary()});
  }
  Communicator* inner_;
};

// Records the address of every asynchronous reduce-scatter's output: on the
// simulator, float32 reduce-scatters add straight into the partition (Note
// [Reduce-scatter into the partition] in zero/stage.h), where bucket k's
// chunk lies before bucket k+1's, so the addresses order the buckets.
class LaunchSpy final : public Communicator {
 public:
  explicit LaunchSpy(Communicator* inner) : inner_(inner) {}
  const Engine* engine = nullptr;
  std::vector<ptrdiff_t> launches;
  // The launches as offsets from the lowest one (comparable across
  // engines).
  std::vector<ptrdiff_t> offsets() const {
    std::vector<ptrdiff_t> out = launches;
    if (out.empty()) return out;
    const ptrdiff_t low = *std::min_element(out.begin(), out.end());
    for (ptrdiff_t& x : out) x -= low;
    return out;
  }
  // Set by the test around Engine::backward(): launches from inside
  // autograd (which runs its hooks with gradients disabled) are counted.
  bool in_call = false;
  int inside_autograd = 0;
  // 'r' an asynchronous reduce-scatter, 'R' a blocking one, in launch order.
  std::string kinds;
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "spy"; }
  bool reduce_scatter_accumulates() const override {
    return inner_->reduce_scatter_accumulates();
  }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    inner_->all_reduce(b, o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    note(out, o, 'R');
    inner_->reduce_scatter(i, out, o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    note(out, o, 'r');
    return inner_->reduce_scatter_async(i, out, o);
  }
  void note(Buffer out, const ReduceScatterOptions& o, char kind) {
    EXPECT_TRUE(o.accumulate);
    launches.push_back(reinterpret_cast<ptrdiff_t>(out.data));
    kinds += kind;
    if (in_call && !torch::GradMode::is_enabled()) ++inside_autograd;
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    inner_->all_gather(i, out, o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    inner_->broadcast(b, o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  Communicator* inner_;
};

// A 2-rank stage 2 config of 1024-element buckets: the MLP's gradient in
// several. `top` and `zero` are added at the top level and to
// zero_optimization (each empty or ending in ", ").
Config stage2_small_buckets(const std::string& top, const std::string& zero) {
  return parse_config("{\"train_micro_batch_size_per_gpu\": 2, " + top +
                          "\"zero_optimization\": {" + zero +
                          "\"stage\": 2, \"reduce_bucket_size\": 1024}}",
                      2);
}

// Stage 2 reduces a bucket from the autograd hook as soon as its parameters
// have their gradients (Note [Stage 2 buckets]): the last layers finish
// first, so the reductions run from the end of the flat buffer towards its
// start, all from inside autograd; with overlap_comm each is asynchronous,
// without it blocking. Same bits.
TEST(EngineTest, Stage2ReducesBucketsInGradientReadyOrder) {
  std::vector<std::vector<ptrdiff_t>> launches(2);
  std::vector<std::string> kinds(2);
  std::vector<int> inside(2);
  std::vector<torch::Tensor> finals(2);
  for (int overlap : {0, 1}) {
    MlpWorldOptions o;
    o.num_samples = 8;
    MlpWorld fx(2,
                stage2_small_buckets("", std::string("\"overlap_comm\": ") +
                                             (overlap ? "true" : "false") +
                                             ", "),
                o);
    fx.world->run([&](int r) {
      LaunchSpy spy(&fx.world->comm(r));
      Engine e(fx.models[r], fx.config, &spy);
      spy.engine = &e;
      spy.in_call = true;
      e.backward(fx.loss_on(r, 2 * r));
      spy.in_call = false;
      e.step();
      if (r == 0) {
        launches[overlap] = spy.offsets();
        kinds[overlap] = spy.kinds;
        inside[overlap] = spy.inside_autograd;
        finals[overlap] = e.flat_parameters().clone();
      }
    });
  }
  for (int overlap : {0, 1}) {
    const auto& l = launches[overlap];
    ASSERT_GT(l.size(), 2u) << overlap;
    EXPECT_TRUE(std::is_sorted(l.rbegin(), l.rend())) << overlap;
    EXPECT_EQ(kinds[overlap], std::string(l.size(), overlap ? 'r' : 'R'));
    EXPECT_EQ(inside[overlap], static_cast<int>(l.size())) << overlap;
  }
  EXPECT_EQ(launches[0], launches[1]);
  EXPECT_TRUE(torch::equal(finals[0], finals[1]));
}

// Note [Reduce once per step] with overlap_comm (zero/stage2.h): in managed
// mode the boundary backward launches each bucket's reduce-scatter from the
// autograd hook once its parameters are complete (last layers first), and
// no other backward reduces anything; unmanaged mode, and managed mode
// without overlap_comm, reduce every bucket after autograd, in bucket
// order. The same buckets of the same data: the same bits, over two
// windows of 3 backward calls.
TEST(EngineTest, Stage2ReduceOnceOverlapLaunchesBucketsInTheBoundaryBackward) {
  struct Run {
    bool managed, overlap;
    std::vector<ptrdiff_t> launches;
    int inside_autograd = 0;
    torch::Tensor final;
  };
  std::vector<Run> runs = {{false, true}, {true, false}, {true, true}};
  for (Run& run : runs) {
    MlpWorldOptions o;
    o.num_samples = 32;
    MlpWorld fx(
        2,
        stage2_small_buckets(
            std::string("\"gradient_accumulation_steps\": 3, "
                        "\"managed_gradient_accumulation\": ") +
                (run.managed ? "true" : "false") + ", ",
            std::string("\"reduce_once_per_step\": true, \"overlap_comm\": ") +
                (run.overlap ? "true" : "false") + ", "),
        o);
    fx.world->run([&](int r) {
      LaunchSpy spy(&fx.world->comm(r));
      Engine e(fx.models[r], fx.config, &spy);
      spy.engine = &e;
      for (int i = 0; i < 6; ++i) {
        spy.in_call = true;
        e.backward(fx.loss(r, i));
        spy.in_call = false;
        if (run.managed || i % 3 == 2) e.step();
      }
      if (r == 0) {
        run.launches = spy.offsets();
        run.inside_autograd = spy.inside_autograd;
        run.final = e.flat_parameters().clone();
      }
    });
  }
  const Run& unmanaged = runs[0];
  const Run& plain = runs[1];
  const Run& hooked = runs[2];
  // Two windows, one reduce-scatter per bucket each.
  ASSERT_GT(plain.launches.size(), 4u);
  ASSERT_EQ(plain.launches.size() % 2, 0u);
  EXPECT_EQ(unmanaged.launches, plain.launches);
  EXPECT_EQ(hooked.launches.size(), plain.launches.size());
  const size_t buckets = plain.launches.size() / 2;
  EXPECT_TRUE(std::is_sorted(plain.launches.begin(),
                             plain.launches.begin() + buckets));
  EXPECT_GT(hooked.launches.front(), hooked.launches[buckets - 1]);
  EXPECT_EQ(unmanaged.inside_autograd, 0);
  EXPECT_EQ(plain.inside_autograd, 0);
  EXPECT_EQ(hooked.inside_autograd, static_cast<int>(hooked.launches.size()));
  EXPECT_TRUE(torch::equal(unmanaged.final, plain.final));
  EXPECT_TRUE(torch::equal(unmanaged.final, hooked.final));
}

// Counts the collectives issued inside autograd's backward: during an
// Engine::backward() call (`in_call`, set by the test), autograd runs the
// backward's functions and hooks with gradients disabled, while the
// engine's own begin/end of the backward run with them enabled.
class InsideBackwardSpy final : public Communicator {
 public:
  explicit InsideBackwardSpy(Communicator* inner) : inner_(inner) {}
  bool in_call = false;
  int inside = 0, outside = 0;
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "spy"; }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    note();
    inner_->all_reduce(b, o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    note();
    inner_->reduce_scatter(i, out, o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    note();
    return inner_->reduce_scatter_async(i, out, o);
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    note();
    inner_->all_gather(i, out, o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    note();
    inner_->broadcast(b, o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  void note() {
    ++(in_call && !torch::GradMode::is_enabled() ? inside : outside);
  }
  Communicator* inner_;
};

// A 2-rank stage 3 config with windows of 3 backward calls, managed or not,
// fp32 or bf16, and `zero` added to zero_optimization.
Config stage3_window_config(const std::string& dtype, bool managed,
                            const std::string& zero) {
  return parse_config(
      "{\"train_micro_batch_size_per_gpu\": 2, "
      "\"gradient_accumulation_steps\": 3, "
      "\"managed_gradient_accumulation\": " +
          std::string(managed ? "true" : "false") + ", " +
          (dtype == "bf16" ? "\"bf16\": {\"enabled\": true}, " : "") +
          "\"zero_optimization\": {\"stage\": 3, " + zero + "}}",
      2);
}

// Note [Stage 3 collectives outside backward] (zero/stage3.h): with
// EngineOptions::stage3_collectives_outside_backward no collective runs
// inside backward (without it, stage 3 gathers and reduce-scatters there),
// and the parameters are the same bits, managed or not, with every group
// in pool slots or the small ones persistent, in fp32 and bf16. A forward
// whose backward never comes is dropped at the step, not left stale.
TEST(EngineTest, Stage3CollectivesOutsideBackwardGiveTheSameBits) {
  for (const std::string threshold : {"0", "100"})
    for (const std::string dtype : {"fp32", "bf16"})
      for (bool managed : {false, true}) {
        const std::string what = "threshold " + threshold + " " + dtype +
                                 (managed ? " managed" : " unmanaged");
        std::vector<torch::Tensor> finals;
        std::vector<int> inside;
        for (bool outside : {false, true}) {
          MlpWorld fx(2, stage3_window_config(
                             dtype, managed,
                             "\"stage3_param_persistence_threshold\": " +
                                 threshold));
          std::vector<torch::Tensor> params(2);
          int in_backward = 0;
          fx.world->run([&](int r) {
            InsideBackwardSpy spy(&fx.world->comm(r));
            EngineOptions o;
            o.stage3_collectives_outside_backward = outside;
            Engine e(fx.models[r], fx.config, &spy, o);
            for (int k = 0; k < 2; ++k) {
              for (int b = 0; b < 3; ++b) {
                torch::Tensor loss = fx.loss(r, 3 * k + b);
                spy.in_call = true;
                e.backward(loss);
                spy.in_call = false;
                // Before window 0's step: a forward with gradients whose
                // backward never comes (its held groups would be stale
                // after the step).
                if (k == 0 && b == 2) (void)fx.loss(r, 40);
                if (managed) e.step();
              }
              if (!managed) e.step();
            }
            params[r] = e.full_parameters();
            if (r == 0) in_backward = spy.inside;
          });
          EXPECT_TRUE(torch::equal(params[0], params[1])) << what;
          finals.push_back(params[0]);
          inside.push_back(in_backward);
        }
        EXPECT_TRUE(same_bits(finals[0], finals[1])) << what;
        EXPECT_GT(inside[0], 0) << what << ": the spy sees nothing";
        EXPECT_EQ(inside[1], 0) << what;
      }
}

// A communicator that claims to overlap its asynchronous collectives (as
// gloo does) while the simulator underneath completes them in the call, so
// that Stage 3 prefetches (Note [Stage 3 prefetch] in zero/stage3.h); with
// `accumulates`, also that its reduce-scatter adds into the output where
// the simulator's does (as gloo's does), so that Stage 3 keeps its
// reduce-scatters in flight under overlap_comm (Note [Stage 3
// reduce-scatter in flight]). It writes down the kind of every collective,
// 'G' an all-gather issued blocking, 'A' one issued asynchronously, 'R' a
// reduce-scatter issued blocking, 'r' one issued asynchronously, 'O' the
// rest; counts the asynchronous reduce-scatters issued and the waits on
// them; and makes the fail_at-th of those (from 1; 0: none) throw
// CommError from its wait.
class AsyncSpy final : public Communicator {
 public:
  explicit AsyncSpy(Communicator* inner, bool accumulates = false,
                    int fail_at = 0)
      : inner_(inner), accumulates_(accumulates), fail_at_(fail_at) {}
  std::string kinds;
  int issued = 0;
  int waited = 0;
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "spy"; }
  bool overlaps_async() const override { return true; }
  bool reduce_scatter_accumulates() const override {
    return accumulates_ && inner_->reduce_scatter_accumulates();
  }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    kinds += 'O';
    inner_->all_reduce(b, o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    kinds += 'R';
    inner_->reduce_scatter(i, out, o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    kinds += 'r';
    const bool fail = ++issued == fail_at_;
    return std::make_shared<Counted>(inner_->reduce_scatter_async(i, out, o),
                                     this, fail);
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    kinds += 'G';
    inner_->all_gather(i, out, o);
  }
  std::shared_ptr<Work> all_gather_async(Buffer i, Buffer out,
                                         const AllGatherOptions& o) override {
    kinds += 'A';
    return inner_->all_gather_async(i, out, o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    kinds += 'O';
    inner_->broadcast(b, o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  class Counted final : public Work {
   public:
    Counted(std::shared_ptr<Work> inner, AsyncSpy* spy, bool fail)
        : inner_(std::move(inner)), spy_(spy), fail_(fail) {}
    void wait() override {
      inner_->wait();
      ++spy_->waited;
      if (fail_) throw CommError("injected: a reduce-scatter failed");
    }

   private:
    std::shared_ptr<Work> inner_;
    AsyncSpy* spy_;
    bool fail_;
  };
  Communicator* inner_;
  bool accumulates_;
  int fail_at_;
};

// Block i of the MLP (a Zero3Block) alone, on two rows of ones: a forward
// of that block's group only.
torch::Tensor mlp_block_forward(torch::nn::Module& model, size_t i) {
  const std::shared_ptr<torch::nn::Module> block = model.children().at(i);
  const torch::Tensor w = block->parameters().at(0);
  return std::dynamic_pointer_cast<MlpLayerImpl>(block)->forward(
      torch::ones({2, w.size(1)}, w.options()));
}

// Rank r's two windows of 3 backward calls (managed: step() after each;
// unmanaged: after the third), with a forward with gradients of the first
// block alone, whose backward never comes, after the first window's third
// backward; `after_first_update` runs after the first window's step.
void two_windows_with_a_stray_forward(
    Engine& e, MlpWorld& fx, int r, bool managed,
    const std::function<void()>& after_first_update) {
  for (int k = 0; k < 2; ++k) {
    for (int b = 0; b < 3; ++b) {
      e.backward(fx.loss(r, 3 * k + b));
      if (k == 0 && b == 2) (void)mlp_block_forward(*fx.models[r], 0);
      if (managed) e.step();
    }
    if (!managed) e.step();
    if (k == 0) after_first_update();
  }
}

// Note [Stage 3 prefetch]: with prefetch (the default size) each block's
// gather issues the next block's asynchronously, in forward and in
// backward, the parameters are the same bits as without it (size 0),
// managed or not, fp32 and bf16, every rank issues as many all-gathers as
// without it, and nothing stale is ever used: a forward of the first block
// alone before the step leaves the second block's gather ahead, and a
// forward of the second block alone after the step must see the updated
// values (the same output as without prefetch). The MLP's three layers are
// three block groups. Every block is released after its forward
// (max_reuse_distance 0), so that its backward gathers too.
TEST(EngineTest, Stage3PrefetchGathersAheadAndGivesTheSameBits) {
  for (const std::string dtype : {"fp32", "bf16"})
    for (bool managed : {false, true}) {
      const std::string what = dtype + (managed ? " managed" : " unmanaged");
      std::vector<torch::Tensor> finals, seconds;
      std::vector<std::string> kinds;
      for (const std::string prefetch : {"0", "5e7"}) {
        MlpWorld fx(2, stage3_window_config(
                           dtype, managed,
                           "\"stage3_param_persistence_threshold\": 0, "
                           "\"stage3_max_reuse_distance\": 0, "
                           "\"stage3_prefetch_bucket_size\": " +
                               prefetch));
        std::vector<torch::Tensor> params(2), second(2);
        std::string rank0_kinds;
        fx.world->run([&](int r) {
          AsyncSpy spy(&fx.world->comm(r));
          Engine e(fx.models[r], fx.config, &spy);
          for (int k = 0; k < 2; ++k) {
            for (int b = 0; b < 3; ++b) {
              e.backward(fx.loss(r, 3 * k + b));
              if (k == 0 && b == 2) {
                (void)fx.loss(r, 40);
                (void)mlp_block_forward(*fx.models[r], 0);
              }
              if (managed) e.step();
            }
            if (!managed) e.step();
            if (k == 0) {
              torch::NoGradGuard no_grad;
              second[r] =
                  mlp_block_forward(*fx.models[r], 1).to(torch::kFloat).clone();
            }
          }
          params[r] = e.full_parameters();
          if (r == 0) rank0_kinds = spy.kinds;
        });
        EXPECT_TRUE(torch::equal(params[0], params[1])) << what;
        finals.push_back(params[0]);
        kinds.push_back(rank0_kinds);
        seconds.push_back(second[0]);
      }
      EXPECT_TRUE(same_bits(finals[0], finals[1])) << what;
      EXPECT_TRUE(same_bits(seconds[0], seconds[1]))
          << what << ": the second block alone after the step";
      auto count = [](const std::string& s, char c) {
        return std::count(s.begin(), s.end(), c);
      };
      EXPECT_EQ(count(kinds[0], 'A'), 0) << what << ": " << kinds[0];
      EXPECT_GT(count(kinds[1], 'A'), 0) << what << ": " << kinds[1];
      // The same gathers, and two issued ahead in vain: block 1's after
      // the first block alone, block 2's after the second block alone.
      EXPECT_EQ(count(kinds[0], 'G') + count(kinds[0], 'A') + 2,
                count(kinds[1], 'G') + count(kinds[1], 'A'))
          << what << ": " << kinds[0] << " against " << kinds[1];
      EXPECT_EQ(count(kinds[0], 'R'), count(kinds[1], 'R')) << what;
      // Backward over blocks 2, 1, 0: block 2's gather, block 1's issued
      // ahead, block 2's reduce-scatter, block 0's ahead, then block 1's
      // and block 0's reduce-scatters. Without prefetch: G R G R G R.
      EXPECT_NE(kinds[1].find("GARARR"), std::string::npos) << kinds[1];
      EXPECT_NE(kinds[0].find("GRGRGR"), std::string::npos) << kinds[0];
    }
}

// Note [Stage 3 reduce-scatter in flight]: with overlap_comm on a backend
// that overlaps, every block group's reduce-scatter in backward is issued
// asynchronously (none blocking), as many as without the option, and the
// parameters are the same bits, managed or not, with every group in flight
// at once (the default reduce_bucket_size) and one at a time (a limit below
// every group). The gradient slots held meanwhile raise the peak memory,
// less with one in flight than with all three blocks.
TEST(EngineTest, Stage3ReduceScattersInFlightGiveTheSameBits) {
  for (bool managed : {false, true}) {
    const std::string what = managed ? "managed" : "unmanaged";
    std::vector<torch::Tensor> finals;
    std::vector<std::string> kinds;
    std::vector<size_t> peaks;
    for (const std::string zero :
         {"\"overlap_comm\": false", "\"overlap_comm\": true",
          "\"overlap_comm\": true, \"reduce_bucket_size\": 8"}) {
      MlpWorld fx(2, stage3_window_config(
                         "fp32", managed,
                         "\"stage3_param_persistence_threshold\": 0, " + zero));
      std::vector<torch::Tensor> params(2);
      std::string rank0_kinds;
      size_t rank0_peak = 0;
      fx.world->run([&](int r) {
        AsyncSpy spy(&fx.world->comm(r), /*accumulates=*/true);
        Engine e(fx.models[r], fx.config, &spy);
        for (int k = 0; k < 2; ++k) {
          for (int b = 0; b < 3; ++b) {
            e.backward(fx.loss(r, 3 * k + b));
            if (managed) e.step();
          }
          if (!managed) e.step();
        }
        params[r] = e.full_parameters();
        if (r == 0) {
          rank0_kinds = spy.kinds;
          rank0_peak = e.memory().peak_bytes;
          EXPECT_EQ(spy.waited, spy.issued) << what << " " << zero;
        }
      });
      EXPECT_TRUE(torch::equal(params[0], params[1])) << what;
      finals.push_back(params[0]);
      kinds.push_back(rank0_kinds);
      peaks.push_back(rank0_peak);
    }
    const auto count = [](const std::string& s, char c) {
      return std::count(s.begin(), s.end(), c);
    };
    EXPECT_GT(count(kinds[0], 'R'), 0) << what << ": " << kinds[0];
    EXPECT_EQ(count(kinds[0], 'r'), 0) << what << ": " << kinds[0];
    for (size_t i : {1, 2}) {
      EXPECT_TRUE(same_bits(finals[0], finals[i])) << what << " " << i;
      EXPECT_EQ(count(kinds[i], 'R'), 0) << what << ": " << kinds[i];
      EXPECT_EQ(count(kinds[i], 'r'), count(kinds[0], 'R'))
          << what << ": " << kinds[i];
    }
    EXPECT_GT(peaks[1], peaks[0]) << what;
    EXPECT_LT(peaks[2], peaks[1]) << what << ": reduce_bucket_size bounds it";
  }
}

// Note [Stage 3 reduce-scatter in flight]: when one of the reduce-scatters
// in flight fails, backward() throws the CommError after every other one
// issued has been waited for (no transfer outlives the gradient storage it
// reads), and the engine refuses a step after it.
TEST(EngineTest, Stage3FailedReduceScatterInFlightWaitsForTheOthers) {
  MlpWorld fx(2,
              stage3_window_config("fp32", /*managed=*/false,
                                   "\"stage3_param_persistence_threshold\": 0, "
                                   "\"overlap_comm\": true"));
  std::vector<int> issued(2), waited(2);
  const std::vector<std::exception_ptr> errors =
      fx.world->run_collect([&](int r) {
        AsyncSpy spy(&fx.world->comm(r), /*accumulates=*/true,
                     /*fail_at=*/2);
        Engine e(fx.models[r], fx.config, &spy);
        try {
          e.backward(fx.loss(r, 0));
          ADD_FAILURE() << "rank " << r << ": backward() did not throw";
        } catch (const CommError& err) {
          EXPECT_NE(std::string(err.what()).find("injected"), std::string::npos)
              << err.what();
        }
        issued[r] = spy.issued;
        waited[r] = spy.waited;
        EXPECT_THROW(e.step(), UsageError) << "rank " << r;
      });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], nullptr) << "rank " << r;
    EXPECT_GE(issued[r], 3) << "rank " << r;  // the MLP's three blocks
    EXPECT_EQ(waited[r], issued[r]) << "rank " << r;
  }
}

// Note [Stage 3 reuse distance]: max_reuse_distance 0 releases every block
// after its forward, so each backward gathers the MLP's three blocks again;
// 1 keeps the last block only (no block runs between its forward and its
// backward); the default 1e9 keeps all three, and backward gathers
// nothing. The parameters are the same bits in all three, managed or not,
// fp32 and bf16; a forward with gradients of the first block alone, whose
// backward never comes, is dropped at the step: the same block run alone
// after the step sees the updated values. Kept blocks take pool slots: at
// 1e9 the pool holds three blocks' parameters, at 0 and 1 one.
TEST(EngineTest, Stage3ReuseDistanceKeepsBlocksGatheredForTheirBackward) {
  const int w = 2;
  for (const std::string dtype : {"fp32", "bf16"})
    for (bool managed : {false, true}) {
      const std::string what = dtype + (managed ? " managed" : " unmanaged");
      std::vector<torch::Tensor> finals, alone;
      std::vector<size_t> gathers, param_bytes;
      for (const std::string reuse : {"0", "1", "1e9"}) {
        MlpWorld fx(w, stage3_window_config(
                           dtype, managed,
                           "\"stage3_param_persistence_threshold\": 0, "
                           "\"stage3_prefetch_bucket_size\": 0, "
                           "\"stage3_max_reuse_distance\": " +
                               reuse));
        std::vector<torch::Tensor> params(w), after(w);
        std::string rank0_kinds;
        size_t rank0_param_bytes = 0;
        fx.world->run([&](int r) {
          AsyncSpy spy(&fx.world->comm(r));
          Engine e(fx.models[r], fx.config, &spy);
          two_windows_with_a_stray_forward(e, fx, r, managed, [&] {
            torch::NoGradGuard no_grad;
            after[r] =
                mlp_block_forward(*fx.models[r], 0).to(torch::kFloat).clone();
          });
          params[r] = e.full_parameters();
          if (r == 0) {
            rank0_kinds = spy.kinds;
            rank0_param_bytes = e.memory().param_bytes;
          }
        });
        EXPECT_TRUE(torch::equal(params[0], params[1])) << what;
        finals.push_back(params[0]);
        alone.push_back(after[0]);
        gathers.push_back(static_cast<size_t>(
            std::count(rank0_kinds.begin(), rank0_kinds.end(), 'G')));
        param_bytes.push_back(rank0_param_bytes);
      }
      for (size_t i : {1, 2}) {
        EXPECT_TRUE(same_bits(finals[0], finals[i])) << what << " " << i;
        EXPECT_TRUE(same_bits(alone[0], alone[i]))
            << what << " " << i << ": the first block alone after the step";
      }
      // Six backward calls: one gather fewer each with 1, three with 1e9.
      EXPECT_EQ(gathers[0], gathers[1] + 6) << what;
      EXPECT_EQ(gathers[0], gathers[2] + 3 * 6) << what;
      EXPECT_EQ(param_bytes[1], param_bytes[0]) << what;
      EXPECT_GT(param_bytes[2], param_bytes[0]) << what;
    }
}

// Note [Stage 3 gather once per step] (zero/stage3.h): with
// gather_once_per_step every block is all-gathered at most once between
// two steps (or loads), whatever the reuse distance, managed or not, fp32
// and bf16, for the same bits; with the default reuse distance it holds no
// more parameter memory. The MLP's three layers are three block groups;
// two windows of 3 backward calls, a forward of the first block without
// backward inside the first window, one after its step, and one after
// weights are loaded over the values it gathered: the last must see the
// loaded values, not the kept ones. With prefetch too, the block gathered
// ahead by the forward after the step is kept for the next window, not
// dropped and gathered again.
TEST(EngineTest, Stage3GatherOncePerStepGathersEachBlockOncePerWindow) {
  const int w = 2;
  const std::string dir = make_temp_dir("gather_once");
  struct Setting {
    const char* reuse;
    bool once;
    const char* prefetch;
  };
  const std::vector<Setting> settings = {{"0", false, "0"},
                                         {"1e9", false, "0"},
                                         {"0", true, "0"},
                                         {"1e9", true, "0"},
                                         {"1e9", true, "5e7"}};
  for (const std::string dtype : {"fp32", "bf16"})
    for (bool managed : {false, true}) {
      const std::string what = dtype + (managed ? " managed" : " unmanaged");
      std::vector<torch::Tensor> finals, after_step, after_load;
      std::vector<size_t> gathers, param_bytes;
      for (const Setting& setting : settings) {
        MlpWorld fx(w, stage3_window_config(
                           dtype, managed,
                           "\"stage3_param_persistence_threshold\": 0, "
                           "\"stage3_prefetch_bucket_size\": " +
                               std::string(setting.prefetch) +
                               ", \"stage3_max_reuse_distance\": " +
                               setting.reuse + ", \"gather_once_per_step\": " +
                               (setting.once ? "true" : "false")));
        const std::string weights = dir + "/" + dtype +
                                    (managed ? "_m_" : "_u_") +
                                    setting.reuse + (setting.once ? "1" : "0") +
                                    setting.prefetch;
        std::vector<torch::Tensor> params(w), stepped(w), loaded(w);
        std::string rank0_kinds;
        size_t rank0_param_bytes = 0;
        fx.world->run([&](int r) {
          AsyncSpy spy(&fx.world->comm(r));
          Engine e(fx.models[r], fx.config, &spy);
          auto output0 = [&] {
            torch::NoGradGuard no_grad;
            return mlp_block_forward(*fx.models[r], 0).to(torch::kFloat).clone();
          };
          two_windows_with_a_stray_forward(e, fx, r, managed, [&] {
            e.export_full_model(weights);
            stepped[r] = output0();
          });
          params[r] = e.full_parameters();
          if (r == 0) {
            rank0_kinds = spy.kinds;
            rank0_param_bytes = e.memory().param_bytes;
          }
          (void)output0();  // gathers (and, with the option, keeps) block 0
          e.load_model_weights(weights);
          loaded[r] = output0();
        });
        EXPECT_TRUE(torch::equal(params[0], params[1])) << what;
        finals.push_back(params[0]);
        after_step.push_back(stepped[0]);
        after_load.push_back(loaded[0]);
        // Gathered in the call ('G') or ahead ('A').
        gathers.push_back(static_cast<size_t>(
            std::count_if(rank0_kinds.begin(), rank0_kinds.end(),
                          [](char c) { return c == 'G' || c == 'A'; })));
        param_bytes.push_back(rank0_param_bytes);
      }
      for (size_t i = 0; i < settings.size(); ++i) {
        const std::string which = what + " setting " + std::to_string(i);
        EXPECT_TRUE(same_bits(finals[0], finals[i])) << which;
        EXPECT_TRUE(same_bits(after_step[0], after_step[i])) << which;
        // After the load, block 0 computes with the loaded weights: the
        // output after the first step.
        EXPECT_TRUE(same_bits(after_step[i], after_load[i])) << which;
      }
      // Reuse 0 gathers each block twice per backward call (36), 1e9 once
      // (18); both once more for block 0's forward without backward and
      // its forward after the step. gather_once_per_step: the three blocks
      // in the first window's first forward, then all three at each of the
      // two steps, so nothing in the second window nor in the forward
      // after the first step: 9 in all, 29 and 11 fewer.
      EXPECT_EQ(gathers[0], gathers[2] + 29) << what;
      EXPECT_EQ(gathers[1], gathers[3] + 11) << what;
      EXPECT_EQ(gathers[2], gathers[3]) << what;
      EXPECT_EQ(gathers[4], gathers[3]) << what;
      // One pool slot per block: what reuse 1e9 holds anyway.
      EXPECT_GT(param_bytes[1], param_bytes[0]) << what;
      EXPECT_EQ(param_bytes[2], param_bytes[1]) << what;
      EXPECT_EQ(param_bytes[3], param_bytes[1]) << what;
    }
}

// Rank 0's collectives (AsyncSpy's letters) of one window of one
// backward() and its step() at world 2 under `config`.
std::string one_window_kinds(const Config& config) {
  MlpWorld fx(2, config);
  std::string kinds;
  fx.world->run([&](int r) {
    AsyncSpy spy(&fx.world->comm(r));
    Engine e(fx.models[r], fx.config, &spy);
    e.backward(fx.loss(r, 0));
    e.step();
    if (r == 0) kinds = spy.kinds;
  });
  return kinds;
}

// With prefetch too: a block kept from its forward issues, at its
// backward, the gather of the block before it, so the first block released
// after its forward still arrives ahead. max_reuse_distance 1 keeps the
// last block: its backward gathers nothing and issues block 1's gather
// ahead ('A'), then block 2's reduce-scatter, block 0's gather ahead, and
// blocks 1's and 0's reduce-scatters.
TEST(EngineTest, Stage3AKeptBlockPrefetchesTheBlockBeforeIt) {
  const std::string kinds = one_window_kinds(
      stage3_window_config("fp32", false,
                           "\"stage3_param_persistence_threshold\": 0, "
                           "\"stage3_max_reuse_distance\": 1"));
  // Forward: block 0's gather, blocks 1's and 2's ahead; the backward's
  // agreement on the window (an all-gather); then the backward. Released
  // after its forward, block 2 would be gathered there: "GAAGGARARR".
  EXPECT_NE(kinds.find("GAAGARARR"), std::string::npos) << kinds;
}

// stage3_max_live_parameters bounds prefetch as in DeepSpeed: with 1
// element no gather is issued ahead (every block group is larger), with
// the default 1e9 the blocks' gathers go ahead in forward and backward.
TEST(EngineTest, Stage3MaxLiveParametersBoundsPrefetch) {
  for (const std::string live : {"1", "1e9"}) {
    const std::string kinds = one_window_kinds(
        stage3_window_config("fp32", false,
                             "\"stage3_param_persistence_threshold\": 0, "
                             "\"stage3_max_reuse_distance\": 0, "
                             "\"stage3_max_live_parameters\": " +
                                 live));
    const auto ahead = std::count(kinds.begin(), kinds.end(), 'A');
    if (live == "1")
      EXPECT_EQ(ahead, 0) << kinds;
    else
      EXPECT_EQ(ahead, 4) << kinds;  // blocks 1, 2 forward; 1, 0 backward
  }
}

size_t total(const MemoryStats& m) {
  return m.param_bytes + m.grad_bytes + m.optimizer_state_bytes;
}

// Stage 3 at world 4, every block released after its forward
// (max_reuse_distance 0; Note [Stage 3 reuse distance]): what a rank holds
// is about a quarter of what stage 0 holds plus one block's full
// parameters and gradients, the buffer pool (Note [Stage 3 buffer pool] in
// zero/stage3.h), which stays allocated between windows: the peak is what
// is held at rest.
TEST(EngineTest, Stage3HoldsAQuarterOfStage0PlusOneBlock) {
  const int w = 4;
  std::vector<MemoryStats> mem(4);  // [stage0 rest, stage3 rest, stage3 peak]
  size_t largest_block = 0;
  for (int stage : {0, 3}) {
    MlpWorldOptions o;
    o.model_scale = 4;
    MlpWorld fx(w,
                parse_config("{\"train_micro_batch_size_per_gpu\": 2, "
                             "\"managed_gradient_accumulation\": false, "
                             "\"zero_optimization\": {\"stage\": " +
                                 std::to_string(stage) +
                                 ", \"stage3_param_persistence_threshold\": 0, "
                                 "\"stage3_max_reuse_distance\": 0}}",
                             w),
                o);
    if (stage == 3)
      for (const auto& m : fx.models[0]->children())
        largest_block = std::max(
            largest_block, static_cast<size_t>(m->parameters()[0].numel() +
                                               m->parameters()[1].numel()));
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      e.reset_peak_memory();
      for (int i = 0; i < 3; ++i) e.backward(fx.loss_on(r, 2 * (i * w + r)));
      e.step();
      if (r == 0) {
        mem[stage == 0 ? 0 : 1] = e.memory();
      }
    });
  }
  const size_t stage0 = total(mem[0]);
  const size_t rest3 = total(mem[1]);
  const size_t peak3 = mem[1].peak_bytes;
  // One block's working set: its full parameters and gradients (padded to
  // 16·W elements), plus the reduce scratch of one partition.
  const size_t quantum = 16 * w;
  const size_t padded = (largest_block + quantum - 1) / quantum * quantum;
  const size_t block = (2 * padded + padded / w) * sizeof(float);
  // Every group is padded on its own: at most one quantum per group more
  // than stage 0's single padding, in each of 4 partition arrays.
  const size_t slack = 3 * quantum * 4 * sizeof(float);
  RecordProperty("stage0_bytes", std::to_string(stage0));
  RecordProperty("stage3_rest_bytes", std::to_string(rest3));
  RecordProperty("stage3_peak_bytes", std::to_string(peak3));
  EXPECT_LE(rest3, stage0 / 4 + block + slack)
      << "stage0 " << stage0 << " stage3 rest " << rest3;
  // The peak also holds what undoes a failed update (Note [Transactional
  // update]): the persistent groups' spare partitions (none here: the
  // threshold is 0) and the moments' commit scratch (a chunk of each).
  const size_t rollback = mem[1].rollback_bytes;
  const size_t owned3 = mem[1].optimizer_state_bytes / (2 * sizeof(float));
  EXPECT_EQ(rollback, 2 * std::min(owned3, FlatOptimizer::kCommitChunk) *
                          sizeof(float));
  EXPECT_EQ(mem[0].rollback_bytes, 0u);  // stage 0 needs none
  EXPECT_LE(peak3, stage0 / 4 + block + slack + rollback)
      << "stage0 " << stage0 << " stage3 peak " << peak3 << " block " << block;
  // One slot of the largest block for parameters and one for gradients,
  // allocated in the first window and reused: nothing above that at any
  // time, and without it the partitions are far below stage 0.
  const size_t pool = 2 * padded * sizeof(float);
  EXPECT_EQ(peak3, rest3 + rollback);
  EXPECT_GE(rest3, pool);
  EXPECT_LT(rest3 - pool, stage0 / 2);
}

// The block finds its engine through the block itself, not through the
// thread that built the engine: training on other threads works (the
// benchmarks build engines in one SimWorld::run and train in later ones).
TEST(EngineTest, Stage3EngineWorksFromThreadsOtherThanItsOwn) {
  Fixture fx(2, 3, /*managed=*/false);
  Config cfg = parse_config(
      R"({"train_micro_batch_size_per_gpu": 2,
          "managed_gradient_accumulation": false,
          "zero_optimization": {"stage": 3,
                                "stage3_param_persistence_threshold": 0}})",
      2);
  std::vector<std::unique_ptr<Engine>> engines(2);
  fx.world->run([&](int r) {
    engines[r] =
        std::make_unique<Engine>(fx.models[r], cfg, &fx.world->comm(r));
  });
  fx.world->run([&](int r) {
    engines[r]->backward(fx.loss(r, 0));
    engines[r]->step();
    EXPECT_EQ(engines[r]->global_steps(), 1);
  });
}

TEST(EngineTest, Stage3FlatAccessorsAreAClearError) {
  MlpWorld fx(2, parse_config(
                     R"({"train_micro_batch_size_per_gpu": 2,
                         "zero_optimization": {"stage": 3}})",
                     2));
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    std::string msg = message_of([&] { e.flat_parameters(); });
    EXPECT_NE(msg.find("use full_parameters()"), std::string::npos) << msg;
    EXPECT_EQ(e.full_parameters().numel(),
              static_cast<int64_t>(e.layout().numel));
  });
}

TEST(EngineTest, UnmanagedBoundaryFlagIsTrueOnlyWhileStepRuns) {
  for (int stage : {0, 1}) {
    Fixture fx(2, stage, /*managed=*/false);
    fx.world->run([&](int r) {
      BoundarySpy spy(&fx.world->comm(r));
      Engine e(fx.models[r], fx.config, &spy);
      spy.engine = &e;
      for (int k = 0; k < 3; ++k) {
        for (int i = 0; i < k + 1; ++i) {
          EXPECT_FALSE(e.is_gradient_accumulation_boundary());
          e.backward(fx.loss(r, i));
        }
        EXPECT_FALSE(e.is_gradient_accumulation_boundary());
        e.step();
        EXPECT_FALSE(e.is_gradient_accumulation_boundary());
      }
      ASSERT_FALSE(spy.seen.empty());
      for (auto [label, flag] : spy.seen) {
        EXPECT_EQ(label, phase::kStep);
        EXPECT_TRUE(flag);
      }
    });
    // Stage 0/1 unmanaged: nothing moves during backward.
    EXPECT_EQ(fx.world->ledger(0).bytes_in(phase::kBackward), 0u);
  }
}

TEST(EngineTest, ManagedReducesInTheBoundaryBackward) {
  Fixture fx(2, 0, /*managed=*/true, /*gas=*/2);
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    for (int i = 0; i < 4; ++i) {
      e.backward(fx.loss(r, i));
      e.step();
      EXPECT_EQ(e.was_step_applied(), i % 2 == 1);
    }
    EXPECT_EQ(e.global_steps(), 2);
    EXPECT_EQ(e.global_samples(), 2 * 8);
    EXPECT_EQ(e.micro_steps(), 4);
  });
  EXPECT_GT(fx.world->ledger(0).bytes_in(phase::kBackward), 0u);
}

TEST(EngineTest, ManagedSecondBackwardAfterTheBoundaryIsRejected) {
  Fixture fx(1, 0, /*managed=*/true, /*gas=*/1);
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    e.backward(fx.loss(r, 0));
    std::string msg = message_of([&] { e.backward(fx.loss(r, 1)); });
    EXPECT_NE(msg.find("after the boundary backward"), std::string::npos)
        << msg;
  });
}

TEST(EngineTest, NonScalarLossIsAUsageError) {
  Fixture fx(1, 0, /*managed=*/false);
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    EXPECT_THROW(e.backward(torch::ones({3}, torch::requires_grad())),
                 UsageError);
    EXPECT_EQ(e.window_backwards(), 0);
  });
}

TEST(EngineTest, FrozenParametersStayOutOfTheFlatBufferAndUnchanged) {
  for (int stage : {1, 2, 3}) {
    Fixture fx(2, stage, /*managed=*/false);
    std::vector<torch::Tensor> frozen_before(2);
    for (int r = 0; r < 2; ++r) {
      auto params = fx.models[r]->parameters();
      params.front().set_requires_grad(false);
      frozen_before[r] = params.front().clone();
    }
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      const size_t trainable = e.parameters().size();
      EXPECT_EQ(trainable, fx.models[r]->parameters().size() - 1);
      for (int k = 0; k < 2; ++k) {
        e.backward(fx.loss(r, k));
        e.step();
      }
      EXPECT_TRUE(
          torch::equal(fx.models[r]->parameters().front(), frozen_before[r]));
    });
  }
}

// Stage 3 on a model with no Zero3Block: everything is one persistent
// group, so it trains exactly like stage 2 with one bucket (same
// arithmetic per element): bitwise equal final parameters.
TEST(EngineTest, Stage3TrainsAModelWithoutBlocks) {
  std::vector<torch::Tensor> finals;
  LogCapture log;
  for (int stage : {2, 3}) {
    SimWorld world({2, 11});
    Config cfg = parse_config(
        "{\"train_micro_batch_size_per_gpu\": 4, "
        "\"managed_gradient_accumulation\": false, \"zero_optimization\": "
        "{\"stage\": " +
            std::to_string(stage) +
            ", \"stage3_param_persistence_threshold\": 0}}",
        2);
    std::vector<std::shared_ptr<torch::nn::Module>> models;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(9);
      models.push_back(torch::nn::Sequential(torch::nn::Linear(6, 10),
                                             torch::nn::Tanh(),
                                             torch::nn::Linear(10, 1))
                           .ptr());
    }
    torch::manual_seed(10);
    torch::Tensor x = torch::randn({16, 6}), y = torch::randn({16, 1});
    torch::Tensor final;
    world.run([&](int r) {
      auto& seq = dynamic_cast<torch::nn::SequentialImpl&>(*models[r]);
      Engine e(models[r], cfg, &world.comm(r));
      for (int step = 0; step < 3; ++step) {
        for (int i = 0; i < 2; ++i) {
          torch::Tensor xb = x.narrow(0, (i * 2 + r) * 4, 4);
          torch::Tensor yb = y.narrow(0, (i * 2 + r) * 4, 4);
          e.backward(torch::mse_loss(seq.forward(xb), yb));
        }
        e.step();
      }
      torch::Tensor p = e.full_parameters();
      if (r == 0) final = p;
    });
    finals.push_back(final);
  }
  EXPECT_TRUE(torch::equal(finals[0], finals[1]));
  // The user is told, once, that stage 3 partitions nothing here.
  const std::vector<LogCapture::Line> logged = log.lines();
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0].first, LogLevel::kWarning);
  EXPECT_NE(logged[0].second.find("4 of 4 trainable parameters (81 of 81 "
                                  "elements, 100%) stay whole on every rank "
                                  "(4 outside every Zero3Block)"),
            std::string::npos)
      << logged[0].second;
}

TEST(EngineTest, IgnoredKeysAreLoggedOnceByRankZero) {
  LogCapture log;
  const int w = 3;
  MlpWorld fx(w, parse_config(config_json(2, false, 4,
                                          ", \"tensorboard\": {}, "
                                          "\"wall_clock_breakdown\": true"),
                              w));
  fx.make_engines();
  const std::vector<LogCapture::Line> seen = log.lines();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, LogLevel::kInfo);
  EXPECT_EQ(seen[0].second,
            "ds_config keys accepted without effect (DeepSpeed keys zerostep "
            "does not act on; see docs/config.md): tensorboard, "
            "wall_clock_breakdown");
}

TEST(EngineTest, NothingIsLoggedWithoutIgnoredKeys) {
  LogCapture log;
  MlpWorld fx(2, parse_config(config_json(1, true, 2), 2));
  fx.make_engines();
  EXPECT_TRUE(log.lines().empty());
}

TEST(EngineTest, ConfigForAnotherWorldSizeIsRejected) {
  Fixture fx(2, 0, false);
  Config one = parse_config(config_json(0, false, 4), 1);
  auto errors = fx.world->run_collect(
      [&](int r) { Engine e(fx.models[r], one, &fx.world->comm(r)); });
  std::string msg = message_of([&] { std::rethrow_exception(errors[0]); });
  EXPECT_NE(msg.find("parsed for world_size 1"), std::string::npos) << msg;
}

// Every rank starts from rank 0's weights, not merely from the same ones: at
// every stage, ranks 1 and 2 of three start from weights of their own, and
// each rank's parameters after construction are rank 0's as they were
// before it (stage 3: gathered by full_parameters(), a collective).
TEST(EngineTest, ReplicasStartFromRankZerosWeights) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const int w = 3;
    Fixture fx(w, stage, false);
    std::vector<torch::Tensor> before(w);
    for (int r = 0; r < w; ++r) {
      torch::NoGradGuard g;
      for (torch::Tensor& p : fx.models[r]->parameters()) p.add_(0.5 * r);
      std::vector<torch::Tensor> flat;
      for (const torch::Tensor& p : fx.models[r]->parameters())
        flat.push_back(p.detach().flatten());
      before[r] = torch::cat(flat).clone();
    }
    // Guards the comparison: the ranks really start apart.
    ASSERT_FALSE(torch::equal(before[0], before[1]));
    ASSERT_FALSE(torch::equal(before[0], before[2]));
    std::vector<torch::Tensor> after(w);
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      after[r] = e.full_parameters();
    });
    for (int r = 0; r < w; ++r)
      EXPECT_TRUE(torch::equal(after[r], before[0])) << "rank " << r;
  }
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// A step's overrides replace the configured hyperparameters for that step
// only: lr 0.001 configured + override 0.01 trains bit for bit like lr 0.01
// configured, and the next step without override is back at 0.001.
TEST(EngineStepOverridesTest, ReplaceConfiguredValuesForOneStepOnly) {
  auto run = [](double configured_lr, std::vector<StepOverrides> steps) {
    MlpWorld fx(
        2, parse_config("{\"train_micro_batch_size_per_gpu\": 2, "
                        "\"managed_gradient_accumulation\": false, "
                        "\"zero_optimization\": {\"stage\": 1}, \"optimizer\": "
                        "{\"type\": \"AdamW\", \"params\": {\"lr\": " +
                            std::to_string(configured_lr) +
                            ", \"weight_decay\": 0.1}}}",
                        2));
    torch::Tensor out;
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      for (size_t k = 0; k < steps.size(); ++k) {
        e.backward(fx.loss_on(r, 4 * k + 2 * r));
        e.step(steps[k]);
      }
      if (r == 0) out = e.full_parameters();
    });
    return out;
  };
  StepOverrides fast;
  fast.lr = 0.01;
  StepOverrides none;
  torch::Tensor a = run(0.01, {none, none});
  torch::Tensor b = run(0.001, {fast, fast});
  EXPECT_TRUE(torch::equal(a, b));
  torch::Tensor c = run(0.001, {fast, none});
  EXPECT_FALSE(torch::equal(a, c));  // the second step was back at 0.001
  StepOverrides clip;
  clip.gradient_clipping = 1e-3;
  EXPECT_FALSE(torch::equal(run(0.01, {clip, clip}), a));
}

TEST(EngineStepOverridesTest, BadValuesAreAUsageErrorThatChangesNothing) {
  Fixture fx(1, 0, /*managed=*/false);
  fx.world->run([&](int r) {
    Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    e.backward(fx.loss(r, 0));
    torch::Tensor before = e.flat_parameters().clone();
    StepOverrides bad;
    bad.lr = -1.0;
    bad.beta2 = 1.0;
    std::string msg = message_of([&] { e.step(bad); });
    EXPECT_NE(msg.find("lr = -1.000000 must be a finite number >= 0"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("beta2 = 1.000000 must be in [0, 1)"), std::string::npos)
        << msg;
    EXPECT_TRUE(torch::equal(before, e.flat_parameters()));
    EXPECT_EQ(e.window_backwards(), 1);
    e.step();  // the window is still open and steps normally
    EXPECT_EQ(e.global_steps(), 1);
  });
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// The schedule feeds the optimizer the lr DeepSpeed's scheduler would, and
// advances only on applied updates: a managed run with GAS 2 (a step()
// after every backward) moves it every other step(). Training with the
// schedule equals training with the same lrs given as per-step overrides.
TEST(EngineScheduleTest, AdvancesOnAppliedUpdatesAndFeedsTheOptimizer) {
  const std::string sched =
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
          "warmup_max_lr": 0.01, "warmup_num_steps": 4,
          "warmup_type": "linear"}})";
  auto make_cfg = [&](bool with_schedule) {
    return parse_config(std::string(R"({"train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.005}})") +
                            (with_schedule ? ", " + sched : "") + "}",
                        1);
  };
  std::vector<double> lrs_seen;
  torch::Tensor scheduled, overridden;
  for (int with_schedule : {1, 0}) {
    MlpWorld fx(1, make_cfg(with_schedule));
    fx.world->run([&](int r) {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
      for (int k = 0; k < 12; ++k) {
        e.backward(fx.loss_on(r, 2 * k));
        StepOverrides o;
        if (with_schedule) {
          lrs_seen.push_back(e.get_lr());
        } else {
          o.lr = lrs_seen[k];
        }
        e.step(o);
      }
      (with_schedule ? scheduled : overridden) = e.full_parameters();
    });
  }
  // Linear warmup over 4 applied updates, DeepSpeed's indexing: updates 1
  // and 2 both at the start of the ramp (iterations -1 and 0), then 1/4,
  // 2/4, 3/4 of the way, then the max. Each value holds for two step()s.
  const double ramp[] = {0.001, 0.001, 0.00325, 0.0055, 0.00775, 0.01};
  ASSERT_EQ(lrs_seen.size(), 12u);
  for (int k = 0; k < 12; ++k)
    EXPECT_NEAR(lrs_seen[k], ramp[k / 2], 1e-12) << "step() " << k;
  EXPECT_TRUE(torch::equal(scheduled, overridden));
}

// Note [Reduce once per step] (zero/stage.h): with
// zero_optimization.reduce_once_per_step, stages 2 and 3 reduce-scatter
// nothing during backward and each window's gradient once in step(), so a
// window of N backwards moves 1/N of the default's reduce-scatter bytes;
// managed and unmanaged stay bitwise equal with it, and stage 3 then holds
// every group's full gradient.
TEST(EngineTest, ReduceOncePerStepReducesEachWindowOnce) {
  const int w = 2, n = 3, windows = 2;
  for (int stage : {2, 3}) {
    struct Run {
      uint64_t rs_backward = 0, rs_step = 0, rs_count = 0;
      torch::Tensor params;
      MemoryStats memory;
    };
    Run runs[2][2];  // [once][managed]
    for (bool once : {false, true})
      for (bool managed : {false, true}) {
        MlpWorldOptions o;
        o.model_scale = 2;
        MlpWorld fx(
            w,
            parse_config("{\"train_micro_batch_size_per_gpu\": 2, "
                         "\"gradient_accumulation_steps\": " +
                             std::to_string(n) +
                             ", \"managed_gradient_accumulation\": " +
                             (managed ? "true" : "false") +
                             ", \"zero_optimization\": {\"stage\": " +
                             std::to_string(stage) +
                             ", \"reduce_bucket_size\": 512"
                             ", \"stage3_param_persistence_threshold\": 0"
                             ", \"reduce_once_per_step\": " +
                             (once ? "true" : "false") + "}}",
                         w),
            o);
        fx.make_engines();
        fx.world->run([&](int r) {
          Engine& e = *fx.engines[r];
          for (int k = 0; k < windows; ++k) {
            for (int i = 0; i < n; ++i) {
              e.backward(fx.loss(r, k * n + i));
              if (managed) e.step();
            }
            if (!managed) e.step();
            EXPECT_TRUE(e.was_step_applied());
          }
        });
        Run& run = runs[once][managed];
        for (const LedgerEntry& x : fx.world->ledger(0).entries()) {
          if (x.kind != CollectiveKind::kReduceScatter) continue;
          ++run.rs_count;
          if (std::string(x.label) == phase::kBackward)
            run.rs_backward += x.bytes;
          if (std::string(x.label) == phase::kStep) run.rs_step += x.bytes;
        }
        run.params = fx.full_parameters()[0];
        run.memory = fx.engines[0]->memory();
      }
    const Run& off = runs[0][0];
    const Run& on = runs[1][0];
    // Default: every backward reduces (a bucket or group per call); once:
    // nothing in backward, one reduction of each per window in step().
    EXPECT_GT(off.rs_backward, 0u) << stage;
    EXPECT_EQ(off.rs_step, 0u) << stage;
    EXPECT_EQ(on.rs_backward, 0u) << stage;
    EXPECT_EQ(on.rs_step * n, off.rs_backward) << stage;
    EXPECT_EQ(on.rs_count * n, off.rs_count) << stage;
    // Managed: the boundary backward reduces the window, as step() does.
    EXPECT_EQ(runs[1][1].rs_backward, on.rs_step) << stage;
    EXPECT_TRUE(same_bits(runs[0][0].params, runs[0][1].params)) << stage;
    EXPECT_TRUE(same_bits(runs[1][0].params, runs[1][1].params)) << stage;
    // Against the default only the order of the sums differs.
    EXPECT_TRUE(torch::allclose(on.params, off.params, 1e-4, 1e-6)) << stage;
    const size_t numel = static_cast<size_t>(on.params.numel());
    // Every group's full gradient (stage 3) or the full flat gradient
    // (stage 2, which otherwise keeps none: Note [Stage 2 buckets]),
    // beside the partition accumulator.
    EXPECT_GE(on.memory.grad_bytes, numel * sizeof(float)) << stage;
    EXPECT_GT(on.memory.grad_bytes, off.memory.grad_bytes) << stage;
  }
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// Note [Transactional update] (zero/stage.h): at stage 1 the staged
// parameters become the parameters by trading the flat buffers' memory, not
// by a copy. The model's parameter tensors follow (they view the buffer),
// their .grad views hold the old parameters until zero_grad() clears them.
// Stage 2 keeps no full gradient (Note [Stage 2 buckets] in zero/stage2.h):
// it updates the parameters in place, flat_gradients() is refused, and no
// parameter keeps a .grad between calls. The bits are stage 0's (stage 1:
// bitwise; stage 2 sums and then divides by W, so within a float32
// rounding), for the plain, bf16 and offload bindings. Under bf16 (without
// offload) stages 1-2 keep no full master (Note [Partitioned master] in
// zero/stage.h): flat_parameters() is refused there.
TEST(EngineTest, Stage1TradesTheFlatBuffersStage2UpdatesInPlace) {
  for (const std::string& extra :
       {std::string(), std::string("\"bf16\": {\"enabled\": true}, "),
        std::string("\"zero_optimization\": {\"offload_optimizer\": "
                    "{\"device\": \"cpu\"}, \"stage\": ")}) {
    SCOPED_TRACE(extra);
    std::vector<torch::Tensor> finals;
    for (int stage : {0, 1, 2}) {
      const bool offload = extra.find("offload") != std::string::npos;
      if (offload && stage == 0) {
        finals.push_back(torch::Tensor());  // offload needs stage >= 1
        continue;
      }
      const std::string zero =
          offload ? extra + std::to_string(stage) + "}"
                  : "\"zero_optimization\": {\"stage\": " +
                        std::to_string(stage) + "}";
      MlpWorld fx(2, parse_config("{\"train_micro_batch_size_per_gpu\": 2, " +
                                      (offload ? std::string() : extra) +
                                      zero + "}",
                                  2));
      fx.make_engines();
      const bool apart = stage > 0 && extra.find("bf16") != std::string::npos;
      fx.world->run([&](int r) {
        Engine& e = *fx.engines[r];
        const torch::Tensor weight = fx.models[r]->parameters().front();
        for (int k = 0; k < 3; ++k) {
          e.backward(fx.loss(r, k));
          if (apart) {
            EXPECT_THROW(e.flat_parameters(), UsageError);
            e.step();
            continue;
          }
          const void* params_before = e.flat_parameters().data_ptr();
          if (stage == 2) {
            EXPECT_THROW(e.flat_gradients(), UsageError);
            e.step();
            EXPECT_EQ(e.flat_parameters().data_ptr(), params_before);
            for (const torch::Tensor& p : fx.models[r]->parameters())
              EXPECT_FALSE(p.grad().defined());
            continue;
          }
          const void* grads_before = e.flat_gradients().data_ptr();
          e.step();
          const bool traded = stage == 1;
          EXPECT_EQ(e.flat_parameters().data_ptr(),
                    traded ? grads_before : params_before);
          EXPECT_EQ(e.flat_gradients().data_ptr(),
                    traded ? params_before : grads_before);
          // The model computes with the new values (bf16: its own copy,
          // rounded from them).
          if (extra.empty()) {
            EXPECT_EQ(weight.data_ptr(), e.flat_parameters().data_ptr());
          }
          EXPECT_EQ(e.flat_gradients().abs().max().item<float>(), 0.0f);
          for (const torch::Tensor& p : fx.models[r]->parameters())
            EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
        }
      });
      finals.push_back(fx.full_parameters()[0]);
    }
    if (finals[0].defined()) {
      EXPECT_TRUE(same_bits(finals[1], finals[0]));
      EXPECT_TRUE(torch::allclose(finals[2], finals[0], 1e-6, 1e-7));
    } else {
      EXPECT_TRUE(torch::allclose(finals[2], finals[1], 1e-6, 1e-7));
    }
  }
}

}  // namespace
}  // namespace zerostep
