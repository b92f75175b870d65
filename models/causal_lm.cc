#include "models/causal_lm.h"

#include <string>

#include "common/errors.h"

namespace zerostep {

void KvCache::repeat_rows(int64_t times) {
  if (times < 1)
    throw UsageError("KvCache::repeat_rows(" + std::to_string(times) +
                     "): times must be >= 1");
  for (auto* list : {&keys, &values})
    for (torch::Tensor& t : *list) t = t.repeat_interleave(times, 0);
}

void check_cached_step(const torch::Tensor& tokens, const KvCache& cache) {
  if (tokens.dim() != 2 || tokens.size(1) < 1 ||
      tokens.scalar_type() != torch::kLong)
    throw UsageError("forward_cached: tokens must be [batch, t >= 1] int64");
  if (tokens.size(0) != cache.batch())
    throw UsageError("forward_cached: a batch of " +
                     std::to_string(tokens.size(0)) + " rows for a cache of " +
                     std::to_string(cache.batch()));
  if (cache.length + tokens.size(1) > cache.capacity())
    throw UsageError("forward_cached: " + std::to_string(cache.length) +
                     " cached + " + std::to_string(tokens.size(1)) +
                     " new positions exceed the cache's " +
                     std::to_string(cache.capacity()));
}

}  // namespace zerostep
