#include "models/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "common/errors.h"

namespace zerostep {
namespace {

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool ends_with(const std::vector<int64_t>& seq,
               const std::vector<int64_t>& suffix) {
  return seq.size() >= suffix.size() &&
         std::equal(suffix.begin(), suffix.end(), seq.end() - suffix.size());
}

// Whether `text` holds `stop` ending past its first `before` bytes: the
// stop strings a step's new bytes complete (Note [Stop strings]).
bool contains_new(const std::string& text, size_t before,
                  const std::string& stop) {
  if (text.size() < stop.size()) return false;
  const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
  return text.find(stop, from) != std::string::npos;
}

// Sample i's generator: its own stream, from (seed, i) alone.
uint64_t sample_seed(uint64_t seed, int64_t i) {
  SampleRng mix(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1)));
  return mix.next();
}

}  // namespace

uint64_t SampleRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void validate_sampling(const CausalLm& model, int64_t prompt_length,
                       int64_t num_samples, const SamplingOptions& o) {
  const int64_t block = model.context_length();
  const int64_t vocab = model.vocab_size();
  if (num_samples < 1 || num_samples > kMaxSamplesPerRequest)
    throw UsageError("num_samples = " + std::to_string(num_samples) +
                     " must be in [1, " +
                     std::to_string(kMaxSamplesPerRequest) +
                     "]. Fix: send several requests for more samples");
  if (prompt_length < 1)
    throw UsageError("the prompt is empty: it must hold at least one token");
  if (o.max_tokens < 1)
    throw UsageError("max_tokens = " + std::to_string(o.max_tokens) +
                     " must be >= 1");
  if (o.max_tokens > block - prompt_length)  // never overflows
    throw UsageError(
        "the prompt's " + std::to_string(prompt_length) + " tokens + " +
        "max_tokens = " + std::to_string(o.max_tokens) +
        " exceed the model's context of " + std::to_string(block) +
        " tokens. Fix: lower max_tokens to at most " +
        std::to_string(std::max<int64_t>(block - prompt_length, 0)) +
        (prompt_length >= block ? " (and shorten the prompt)" : ""));
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw UsageError("temperature = " + num(o.temperature) +
                     " must be a finite number >= 0 (0 is greedy)");
  if (o.top_k < -1)
    throw UsageError("top_k = " + std::to_string(o.top_k) +
                     " must be -1 or 0 (no limit) or >= 1");
  if (!std::isfinite(o.top_p) || o.top_p <= 0 || o.top_p > 1)
    throw UsageError("top_p = " + num(o.top_p) +
                     " must be in (0, 1] (1: no nucleus filter)");
  for (size_t i = 0; i < o.stop.size(); ++i) {
    if (o.stop[i].empty())
      throw UsageError("stop sequence " + std::to_string(i) +
                       " is empty. Fix: remove it");
    for (int64_t t : o.stop[i])
      if (t < 0 || t >= vocab)
        throw UsageError("stop sequence " + std::to_string(i) +
                         " holds token " + std::to_string(t) +
                         ", outside the vocabulary [0, " +
                         std::to_string(vocab) + ")");
  }
  for (size_t i = 0; i < o.stop_strings.size(); ++i)
    if (o.stop_strings[i].empty())
      throw UsageError("stop string " + std::to_string(i) +
                       " is empty. Fix: remove it");
  if (!o.stop_strings.empty() &&
      (o.token_text == nullptr ||
       static_cast<int64_t>(o.token_text->size()) < vocab))
    throw UsageError(
        "stop strings need the tokenizer's text of every token id, and this "
        "model has none (a folder without a byte-level tokenizer.json?). "
        "Fix: stop on token ids instead");
}

int64_t choose_token(const float* logits, int64_t vocab,
                     const SamplingOptions& o, double u) {
  ZS_CHECK(vocab >= 1);
  if (o.temperature == 0.0)
    return std::max_element(logits, logits + vocab) - logits;  // first max
  // Most likely first; ties by index, so the order is total.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int64_t keep = vocab;
  if (o.top_k > 0 && o.top_k < vocab) {
    keep = o.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      more_likely);
  } else {
    std::sort(order.begin(), order.end(), more_likely);
  }
  const double top = static_cast<double>(logits[order[0]]) / o.temperature;
  std::vector<double> weight(static_cast<size_t>(keep));
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    weight[i] =
        std::exp(static_cast<double>(logits[order[i]]) / o.temperature - top);
    total += weight[i];
  }
  if (o.top_p < 1.0) {
    double cumulative = 0.0;
    int64_t n = 0;
    while (n < keep) {
      cumulative += weight[n++];
      if (cumulative >= o.top_p * total) break;
    }
    keep = n;
    total = cumulative;
  }
  const double target = u * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += weight[i];
    if (target < cumulative) return order[i];
  }
  return order[keep - 1];  // u * total rounded up to the last boundary
}

SampleOutput sample(CausalLm& model, const std::vector<int64_t>& prompt,
                    int64_t num_samples, const SamplingOptions& o) {
  const int64_t p = static_cast<int64_t>(prompt.size());
  validate_sampling(model, p, num_samples, o);
  const int64_t vocab = model.vocab_size();
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw UsageError("prompt token " + std::to_string(i) + " = " +
                       std::to_string(prompt[i]) +
                       " is outside the vocabulary [0, " +
                       std::to_string(vocab) + ")");
  torch::NoGradGuard no_grad;
  const int64_t n = num_samples, total = p + o.max_tokens;
  // Every row's tokens so far (the recompute path's input).
  torch::Tensor seqs = torch::zeros({n, total}, torch::kLong);
  seqs.narrow(1, 0, p).copy_(torch::tensor(prompt, torch::kLong).unsqueeze(0));
  torch::Tensor prompt_ids = seqs.narrow(0, 0, 1).narrow(1, 0, p);

  KvCache cache;
  torch::Tensor prefill;  // [1, p, vocab]
  if (o.use_kv_cache) {
    cache = model.new_cache(1, total);
    prefill = model.forward_cached(prompt_ids, &cache);
    cache.repeat_rows(n);
  } else {
    prefill = model.logits(prompt_ids);
  }
  SampleOutput out;
  if (o.prompt_logprobs) {
    out.prompt_logprobs.assign(static_cast<size_t>(p),
                               std::numeric_limits<float>::quiet_NaN());
    if (p > 1) {
      torch::Tensor lp =
          torch::log_softmax(prefill[0].narrow(0, 0, p - 1).to(torch::kFloat), -1)
              .gather(1, prompt_ids[0].narrow(0, 1, p - 1).unsqueeze(1))
              .squeeze(1)
              .contiguous();
      std::copy(lp.data_ptr<float>(), lp.data_ptr<float>() + (p - 1),
                out.prompt_logprobs.begin() + 1);
    }
  }
  torch::Tensor last = prefill.select(1, p - 1)
                           .expand({n, vocab})
                           .to(torch::kFloat)
                           .contiguous();  // [n, V]

  out.sequences.resize(static_cast<size_t>(n));
  std::vector<std::string> text(static_cast<size_t>(n));  // Note [Stop strings]
  std::vector<SampleRng> rngs;
  for (int64_t i = 0; i < n; ++i) rngs.emplace_back(sample_seed(o.seed, i));
  int64_t active = n;
  for (int64_t step = 0; step < o.max_tokens && active > 0; ++step) {
    torch::Tensor lp = torch::log_softmax(last, -1).contiguous();
    const float* logits = last.data_ptr<float>();
    const float* lps = lp.data_ptr<float>();
    std::vector<int64_t> next(static_cast<size_t>(n), 0);
    for (int64_t r = 0; r < n; ++r) {
      SampledSequence& s = out.sequences[r];
      const double u = rngs[r].uniform();  // drawn every step: fixed streams
      if (s.stopped) continue;
      const int64_t t = choose_token(logits + r * vocab, vocab, o, u);
      next[r] = t;
      s.tokens.push_back(t);
      s.logprobs.push_back(lps[r * vocab + t]);
      bool stop = false;
      for (const auto& ids : o.stop) stop = stop || ends_with(s.tokens, ids);
      if (!o.stop_strings.empty()) {
        const size_t before = text[r].size();
        text[r] += (*o.token_text)[static_cast<size_t>(t)];
        for (const std::string& str : o.stop_strings)
          stop = stop || contains_new(text[r], before, str);
      }
      if (stop) {
        s.stopped = true;
        --active;
      }
    }
    if (step + 1 == o.max_tokens || active == 0) break;
    torch::Tensor ids = torch::tensor(next, torch::kLong).unsqueeze(1);
    if (o.use_kv_cache) {
      last = model.forward_cached(ids, &cache)
                 .select(1, 0)
                 .to(torch::kFloat)
                 .contiguous();
    } else {
      seqs.narrow(1, p + step, 1).copy_(ids);
      last = model.logits(seqs.narrow(1, 0, p + step + 1))
                 .select(1, p + step)
                 .to(torch::kFloat)
                 .contiguous();
    }
  }
  return out;
}

}  // namespace zerostep
