// zerostep_sample: the zerostep side of sample_vs_generate.py (docs/
// benchmarks.md, "Sampling a Hugging Face folder"): the trainer server's
// sampler (models/sampler.h, KV cache) on a folder's decoder.
//
//   bazel-bin/benchmarks/peers/zerostep_sample --hf=DIR --threads=2
//       --prompt=16 --max-tokens=64 --samples=4 --calls=3 --warmup=1
//   (one command line)
//
// Loads DIR (models/hf_decoder.h, float32), sets --threads compute
// threads, then runs --warmup untimed and --calls timed sample() calls of
// --samples continuations of one --prompt-token prompt (ids 1, 8, 15, ...
// modulo the vocabulary), --max-tokens each, temperature 1, no top-k/top-p,
// no stop (every call generates samples * max_tokens tokens), seed = the
// call's index. Prints one JSON line per timed call {"ms", "tokens"}, then
// {"summary": ...} with the process's resident memory before the first
// call and its peak after the last (VmHWM: the peak of the whole run,
// loading included) and the KV cache's bytes (2 * layers * samples *
// kv_heads * (prompt + max_tokens) * head_dim * 4).
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/errors.h"
#include "models/hf_decoder.h"
#include "models/sampler.h"

namespace zerostep {
namespace {

// /proc/self/status's `key` (VmRSS, VmHWM) in MiB; -1 if unreadable.
double status_mib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0)
      return std::stod(line.substr(key.size() + 1)) / 1024.0;  // kB
  return -1;
}

int run(int argc, char** argv) {
  std::string dir;
  int64_t threads = 1, prompt = 16, max_tokens = 64, samples = 4, calls = 3,
          warmup = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "--hf") dir = v;
    else if (k == "--threads") threads = parse_int(k, v, 1, 1024);
    else if (k == "--prompt") prompt = parse_int(k, v, 1, 1 << 20);
    else if (k == "--max-tokens") max_tokens = parse_int(k, v, 1, 1 << 20);
    else if (k == "--samples") samples = parse_int(k, v, 1, kMaxSamplesPerRequest);
    else if (k == "--calls") calls = parse_int(k, v, 1, 1000);
    else if (k == "--warmup") warmup = parse_int(k, v, 0, 1000);
    else throw UsageError("zerostep_sample: unknown argument '" + a + "'");
  }
  if (dir.empty()) throw UsageError("zerostep_sample: --hf=DIR is required");
  at::set_num_threads(static_cast<int>(threads));
  HfCausalLm model = load_hf_decoder(dir);
  for (torch::Tensor& p : model->parameters()) p.set_requires_grad(false);
  const HfDecoderConfig& c = model->config();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < prompt; ++i) ids.push_back((1 + 7 * i) % c.vocab_size);
  SamplingOptions o;
  o.max_tokens = max_tokens;
  const double rss_before = status_mib("VmRSS");
  for (int64_t i = 0; i < warmup + calls; ++i) {
    o.seed = static_cast<uint64_t>(i);
    const auto start = std::chrono::steady_clock::now();
    const SampleOutput out = sample(*model, ids, samples, o);
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    int64_t tokens = 0;
    for (const SampledSequence& s : out.sequences)
      tokens += static_cast<int64_t>(s.tokens.size());
    if (i >= warmup)
      std::printf("{\"ms\": %.3f, \"tokens\": %lld}\n", ms,
                  static_cast<long long>(tokens));
  }
  const double kv_mib = 2.0 * c.num_hidden_layers * samples *
                        c.num_key_value_heads * (prompt + max_tokens) *
                        c.head_dim * 4 / (1024.0 * 1024.0);
  std::printf(
      "{\"summary\": {\"rss_before_mib\": %.1f, \"peak_rss_mib\": %.1f, "
      "\"kv_cache_mib\": %.2f, \"threads\": %d}}\n",
      rss_before, status_mib("VmHWM"), kv_mib, at::get_num_threads());
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerostep_sample: %s\n", e.what());
    return 2;
  }
}
