// sampling_bench: generated tokens per second of models/sampler.h with the
// KV cache (TinyGptImpl::forward_cached: the prompt once, then one token per
// step) against the recompute-every-token loop (forward() over the whole
// prefix at every step; SamplingOptions::use_kv_cache = false), timed
// alternately in the same benchmark so that their ratio is taken under the
// same machine conditions (a shared 2-core VM).
//
//   ./bazelw run //benchmarks:sampling_bench --
//       --benchmark_min_time=0.5 --benchmark_format=json
//       --benchmark_out=/tmp/sampling.json --benchmark_out_format=json
//   (one command line)
//
// One benchmark per (model, num_samples): BM_Sample/d_model:D/layers:L/
// samples:N. The model is the trainer server's byte-level TinyGpt shape
// (vocab 256, context 64, 2 heads) with LoRA rank 4 adapters, d_model D and
// L layers; D=32, L=2 is the served "zerostep/tiny-gpt". Each request is an
// 8-token prompt and max_tokens = 56 (the rest of the context), no stop,
// temperature 1, seed fixed: N * 56 tokens per request. Every iteration
// runs one request each way, rotating which goes first; the manual time is
// the cached path's.
// Counters (see docs/benchmarks.md):
//   kv_tokens_per_second, recompute_tokens_per_second   tokens / median time
//   kv_over_recompute    the median over iterations of the paired ratio of
//                        the recompute time to the cached time (> 1: the
//                        cache is faster)
//   kv_ms, recompute_ms  median request times
//   same_tokens          1 if both paths drew the same tokens (they should,
//                        up to float rounding of the logits)
//   max_abs_logprob_diff between the two paths' logprobs
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "models/sampler.h"
#include "models/tiny_gpt.h"

namespace zerostep {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_Sample(benchmark::State& state) {
  TinyGptOptions o;
  o.vocab_size = 256;
  o.block_size = 64;
  o.d_model = state.range(0);
  o.n_layer = state.range(1);
  o.n_head = 2;
  o.lora.rank = 4;
  torch::manual_seed(1234);
  TinyGpt model(o);
  const int64_t samples = state.range(2);
  const std::vector<int64_t> prompt = {116, 104, 101, 32, 113, 117, 105, 99};
  SamplingOptions kv;
  kv.max_tokens = o.block_size - static_cast<int64_t>(prompt.size());
  kv.seed = 7;
  SamplingOptions recompute = kv;
  recompute.use_kv_cache = false;

  std::vector<double> kv_s, re_s, ratio;
  bool same = true;
  double max_diff = 0.0;
  int64_t iteration = 0;
  for (auto _ : state) {
    double t_kv = 0, t_re = 0;
    SampleOutput a, b;
    auto run = [&](const SamplingOptions& opt, SampleOutput* out) {
      const auto t0 = std::chrono::steady_clock::now();
      *out = sample(model, prompt, samples, opt);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           t0)
          .count();
    };
    if (iteration++ % 2 == 0) {
      t_kv = run(kv, &a);
      t_re = run(recompute, &b);
    } else {
      t_re = run(recompute, &b);
      t_kv = run(kv, &a);
    }
    state.SetIterationTime(t_kv);
    kv_s.push_back(t_kv);
    re_s.push_back(t_re);
    ratio.push_back(t_re / t_kv);
    for (int64_t i = 0; i < samples; ++i) {
      same = same && a.sequences[i].tokens == b.sequences[i].tokens;
      const size_t n = std::min(a.sequences[i].logprobs.size(),
                                b.sequences[i].logprobs.size());
      for (size_t t = 0; t < n; ++t)
        max_diff = std::max(
            max_diff, std::abs(static_cast<double>(a.sequences[i].logprobs[t]) -
                               b.sequences[i].logprobs[t]));
    }
  }
  const double tokens = static_cast<double>(samples * kv.max_tokens);
  state.counters["kv_tokens_per_second"] = tokens / median(kv_s);
  state.counters["recompute_tokens_per_second"] = tokens / median(re_s);
  state.counters["kv_over_recompute"] = median(ratio);
  state.counters["kv_ms"] = 1000 * median(kv_s);
  state.counters["recompute_ms"] = 1000 * median(re_s);
  state.counters["same_tokens"] = same ? 1 : 0;
  state.counters["max_abs_logprob_diff"] = max_diff;
}

BENCHMARK(BM_Sample)
    ->ArgNames({"d_model", "layers", "samples"})
    ->Args({32, 2, 1})
    ->Args({32, 2, 8})
    ->Args({32, 2, 32})
    ->Args({128, 4, 1})
    ->Args({128, 4, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

BENCHMARK_MAIN();
