#include "comm/conformance.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "common/errors.h"

namespace zerostep {
namespace {

// Values are small integers so that every reduction order gives the same
// bits: the suite checks semantics, not a backend's summation order.
template <typename T>
T value_at(int rank, size_t i) {
  return static_cast<T>((rank + 1) * 10 + static_cast<int>(i % 7));
}

template <typename T>
void check_all_reduce(Communicator& c, ReduceOp op) {
  const int w = c.world_size();
  const size_t n = 37;  // not a multiple of common world sizes
  std::vector<T> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = value_at<T>(c.rank(), i);
  c.all_reduce(Buffer::of(buf.data(), n), {op});
  for (size_t i = 0; i < n; ++i) {
    T expect = value_at<T>(0, i);
    for (int r = 1; r < w; ++r) {
      T x = value_at<T>(r, i);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) expect += x;
      if (op == ReduceOp::kMax) expect = std::max(expect, x);
      if (op == ReduceOp::kMin) expect = std::min(expect, x);
    }
    if (op == ReduceOp::kAvg) expect = expect / static_cast<T>(w);
    ASSERT_EQ(buf[i], expect) << "rank " << c.rank() << " element " << i
                              << " op " << to_string(op);
  }
}

void all_reduce_every_op_and_dtype(Communicator& c) {
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    check_all_reduce<float>(c, op);
    check_all_reduce<double>(c, op);
    if (op != ReduceOp::kAvg) check_all_reduce<int64_t>(c, op);
  }
}

void reduce_scatter_gives_each_rank_its_chunk(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 5;
  std::vector<float> in(chunk * w);
  for (size_t i = 0; i < in.size(); ++i) in[i] = value_at<float>(c.rank(), i);
  std::vector<float> out(chunk, -1.0f);
  c.reduce_scatter(Buffer::of(in.data(), in.size()),
                   Buffer::of(out.data(), chunk), {ReduceOp::kSum});
  for (size_t i = 0; i < chunk; ++i) {
    const size_t g = c.rank() * chunk + i;
    float expect = 0;
    for (int r = 0; r < w; ++r) expect += value_at<float>(r, g);
    ASSERT_EQ(out[i], expect) << "rank " << c.rank() << " element " << i;
  }
}

// ReduceScatterOptions::accumulate: output + the reduced chunk, the ranks
// folded first (1e8 + 3 + 3 rounds back to 1e8 in float, 1e8 + 6 does not),
// blocking and async; a backend without reduce_scatter_accumulates()
// refuses it on every rank, before anything moves.
void reduce_scatter_accumulates_where_supported(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 7;
  std::vector<float> in(chunk * w, 3.0f);
  std::vector<float> out(chunk);
  for (size_t i = 0; i < chunk; ++i) out[i] = 1e8f + 16.0f * i;
  const std::vector<float> before = out;
  ReduceScatterOptions o;
  o.accumulate = true;
  const Buffer bin = Buffer::of(in.data(), in.size());
  const Buffer bout = Buffer::of(out.data(), chunk);
  if (!c.reduce_scatter_accumulates()) {
    EXPECT_THROW(c.reduce_scatter(bin, bout, o), UsageError);
    EXPECT_THROW(c.reduce_scatter_async(bin, bout, o), UsageError);
    EXPECT_EQ(out, before);
    return;
  }
  float fold = 3.0f;
  for (int r = 1; r < w; ++r) fold = fold + 3.0f;
  c.reduce_scatter(bin, bout, o);
  for (size_t i = 0; i < chunk; ++i)
    ASSERT_EQ(out[i], before[i] + fold) << "rank " << c.rank() << " " << i;
  c.reduce_scatter_async(bin, bout, o)->wait();
  for (size_t i = 0; i < chunk; ++i)
    ASSERT_EQ(out[i], (before[i] + fold) + fold)
        << "async: rank " << c.rank() << " " << i;
  o.op = ReduceOp::kAvg;
  out = before;
  c.reduce_scatter(bin, bout, o);
  for (size_t i = 0; i < chunk; ++i)
    ASSERT_EQ(out[i], before[i] + fold / static_cast<float>(w))
        << "kAvg: rank " << c.rank() << " " << i;
}

void async_reduce_scatters_match_in_issue_order(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 6;
  std::vector<std::vector<float>> ins(3, std::vector<float>(chunk * w));
  std::vector<std::vector<float>> outs(3, std::vector<float>(chunk, -1.0f));
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < ins[k].size(); ++i)
      ins[k][i] = static_cast<float>(k * 1000 + c.rank() * 10 + i % 5);
    works.push_back(c.reduce_scatter_async(
        Buffer::of(ins[k].data(), ins[k].size()),
        Buffer::of(outs[k].data(), chunk), {ReduceOp::kSum}));
  }
  // A blocking collective issued while async ones may be in flight.
  float x = 1.0f;
  c.all_reduce(Buffer::of(&x, 1), {});
  ASSERT_EQ(x, static_cast<float>(w));
  for (int k = 2; k >= 0; --k) works[k]->wait();  // any wait order
  for (int k = 0; k < 3; ++k) {
    works[k]->wait();  // a second wait returns at once
    for (size_t i = 0; i < chunk; ++i) {
      const size_t g = c.rank() * chunk + i;
      float expect = 0;
      for (int r = 0; r < w; ++r)
        expect += static_cast<float>(k * 1000 + r * 10 + g % 5);
      ASSERT_EQ(outs[k][i], expect) << "op " << k << " element " << i;
    }
  }
}

// A blocking collective issued while `works` may be in flight, then every
// work waited for, last issued first.
void block_then_wait_in_reverse(Communicator& c,
                                std::vector<std::shared_ptr<Work>>& works) {
  float x = 2.0f;
  c.all_reduce(Buffer::of(&x, 1), {});
  EXPECT_EQ(x, 2.0f * c.world_size());
  for (size_t k = works.size(); k-- > 0;) works[k]->wait();
}

// 1 + 2 + ... + w: the sum over ranks of a buffer of rank + 1.
float sum_of_rank_numbers(int w) { return static_cast<float>(w * (w + 1) / 2); }

// Async all-reduces interleaved with async reduce-scatters and a blocking
// collective: matched in issue order, waited in any order, average too.
void async_all_reduces_match_in_issue_order(Communicator& c) {
  const int w = c.world_size();
  const size_t n = 7;
  std::vector<std::vector<float>> bufs(3, std::vector<float>(n));
  std::vector<float> rs_in(2 * w, static_cast<float>(c.rank() + 1)),
      rs_out(2, -1.0f);
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < n; ++i)
      bufs[k][i] = static_cast<float>(k * 100 + c.rank() * 4 + i);
    works.push_back(c.all_reduce_async(
        Buffer::of(bufs[k].data(), n),
        {k == 1 ? ReduceOp::kAvg : ReduceOp::kSum}));
    if (k == 0)
      works.push_back(c.reduce_scatter_async(
          Buffer::of(rs_in.data(), rs_in.size()),
          Buffer::of(rs_out.data(), rs_out.size()), {ReduceOp::kSum}));
  }
  block_then_wait_in_reverse(c, works);
  for (float v : rs_out) ASSERT_EQ(v, sum_of_rank_numbers(w));
  for (int k = 0; k < 3; ++k)
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < w; ++r) sum += static_cast<float>(k * 100 + r * 4 + i);
      const float expect = k == 1 ? sum / static_cast<float>(w) : sum;
      ASSERT_EQ(bufs[k][i], expect) << "op " << k << " element " << i;
    }
}

void all_gather_concatenates_in_rank_order(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 3;
  std::vector<double> in(chunk);
  for (size_t i = 0; i < chunk; ++i) in[i] = c.rank() * 100.0 + i;
  std::vector<double> out(chunk * w, -1.0);
  c.all_gather(Buffer::of(in.data(), chunk), Buffer::of(out.data(), out.size()),
               {});
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < chunk; ++i)
      ASSERT_EQ(out[r * chunk + i], r * 100.0 + i) << "rank " << c.rank();
}

void all_gather_in_place_from_own_slice(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 4;
  std::vector<float> buf(chunk * w, -1.0f);
  for (size_t i = 0; i < chunk; ++i)
    buf[c.rank() * chunk + i] = static_cast<float>(c.rank() * 10 + i);
  c.all_gather(Buffer::of(buf.data() + c.rank() * chunk, chunk),
               Buffer::of(buf.data(), buf.size()), {});
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < chunk; ++i)
      ASSERT_EQ(buf[r * chunk + i], static_cast<float>(r * 10 + i));
}

// Async all-gathers (one into a buffer whose own chunk is its input)
// interleaved with an async reduce-scatter and a blocking collective:
// matched in issue order, waited in any order.
void async_all_gathers_match_in_issue_order(Communicator& c) {
  const int w = c.world_size();
  const size_t chunk = 5;
  std::vector<std::vector<float>> ins(2, std::vector<float>(chunk));
  std::vector<std::vector<float>> outs(3, std::vector<float>(chunk * w, -1.0f));
  std::vector<float> rs_in(3 * w, static_cast<float>(c.rank() + 1)),
      rs_out(3, -1.0f);
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < chunk; ++i)
      ins[k][i] = static_cast<float>(k * 1000 + c.rank() * 10 + i);
    works.push_back(c.all_gather_async(Buffer::of(ins[k].data(), chunk),
                                       Buffer::of(outs[k].data(), chunk * w),
                                       {}));
    if (k == 0)
      works.push_back(c.reduce_scatter_async(
          Buffer::of(rs_in.data(), rs_in.size()),
          Buffer::of(rs_out.data(), rs_out.size()), {ReduceOp::kSum}));
  }
  float* own = outs[2].data() + c.rank() * chunk;
  for (size_t i = 0; i < chunk; ++i)
    own[i] = static_cast<float>(2000 + c.rank() * 10 + i);
  works.push_back(c.all_gather_async(
      Buffer::of(own, chunk), Buffer::of(outs[2].data(), chunk * w), {}));
  block_then_wait_in_reverse(c, works);
  for (float v : rs_out) ASSERT_EQ(v, sum_of_rank_numbers(w));
  for (int k = 0; k < 3; ++k)
    for (int r = 0; r < w; ++r)
      for (size_t i = 0; i < chunk; ++i)
        ASSERT_EQ(outs[k][r * chunk + i],
                  static_cast<float>(k * 1000 + r * 10 + i))
            << "gather " << k << " rank " << r << " element " << i;
}

void broadcast_from_every_root(Communicator& c) {
  for (int root = 0; root < c.world_size(); ++root) {
    std::vector<int64_t> buf(6, c.rank() == root ? 1000 + root : -1);
    c.broadcast(Buffer::of(buf.data(), buf.size()), {root});
    for (int64_t v : buf) ASSERT_EQ(v, 1000 + root) << "root " << root;
  }
}

void empty_buffers_are_fine(Communicator& c) {
  std::vector<float> none;
  c.all_reduce(Buffer::of(none.data(), 0), {});
  c.barrier();
}

void long_mixed_sequence_stays_matched(Communicator& c) {
  const int w = c.world_size();
  for (int k = 0; k < 50; ++k) {
    float x = static_cast<float>(c.rank() + k);
    c.all_reduce(Buffer::of(&x, 1), {ReduceOp::kSum});
    float expect = 0;
    for (int r = 0; r < w; ++r) expect += static_cast<float>(r + k);
    ASSERT_EQ(x, expect) << "iteration " << k;
    if (k % 10 == 0) c.barrier();
  }
}

struct Case {
  const char* name;
  void (*body)(Communicator&);
};

const Case kCases[] = {
    {"AllReduceEveryOpAndDtype", all_reduce_every_op_and_dtype},
    {"ReduceScatterGivesEachRankItsChunk",
     reduce_scatter_gives_each_rank_its_chunk},
    {"ReduceScatterAccumulatesWhereSupported",
     reduce_scatter_accumulates_where_supported},
    {"AsyncReduceScattersMatchInIssueOrder",
     async_reduce_scatters_match_in_issue_order},
    {"AsyncAllReducesMatchInIssueOrder",
     async_all_reduces_match_in_issue_order},
    {"AllGatherConcatenatesInRankOrder", all_gather_concatenates_in_rank_order},
    {"AllGatherInPlaceFromOwnSlice", all_gather_in_place_from_own_slice},
    {"AsyncAllGathersMatchInIssueOrder",
     async_all_gathers_match_in_issue_order},
    {"BroadcastFromEveryRoot", broadcast_from_every_root},
    {"EmptyBuffersAreFine", empty_buffers_are_fine},
    {"LongMixedSequenceStaysMatched", long_mixed_sequence_stays_matched},
};

class ConformanceTest : public ::testing::Test {
 public:
  ConformanceTest(std::function<std::unique_ptr<ConformanceRunner>()> make,
                  int world, void (*body)(Communicator&))
      : make_(std::move(make)), world_(world), body_(body) {}
  void TestBody() override {
    std::unique_ptr<ConformanceRunner> runner = make_();
    runner->run(world_, [this](Communicator& c) {
      ASSERT_EQ(c.world_size(), world_);
      body_(c);
    });
  }

 private:
  std::function<std::unique_ptr<ConformanceRunner>()> make_;
  int world_;
  void (*body_)(Communicator&);
};

}  // namespace

void register_communicator_conformance(
    const std::string& backend,
    std::function<std::unique_ptr<ConformanceRunner>()> make_runner) {
  std::vector<int> worlds = make_runner()->world_sizes();
  for (const Case& c : kCases) {
    for (int w : worlds) {
      const std::string suite = "CommConformance/" + backend + "." + c.name;
      const std::string name = "world" + std::to_string(w);
      ::testing::RegisterTest(
          suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
          [make_runner, w, body = c.body]() -> ::testing::Test* {
            return new ConformanceTest(make_runner, w, body);
          });
    }
  }
}

}  // namespace zerostep
