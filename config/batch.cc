#include "config/batch.h"

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "config/text.h"

namespace zerostep {
namespace {

using config_text::closest;
using config_text::lower;

using Json = ConfigJson;

constexpr const char* kBatchRelation =
    "train_batch_size = train_micro_batch_size_per_gpu × "
    "gradient_accumulation_steps × world_size";

// "e.g. 16 or 32": the multiples of `d` around `t`.
std::string multiples_near(int64_t t, int64_t d) {
  int64_t below = t / d * d;
  std::string s = "e.g. ";
  if (below > 0) s += std::to_string(below) + " or ";
  return s + std::to_string(below + d);
}

struct BatchTriple {
  int64_t tbs = 0;
  int64_t micro = 0;
  int64_t gas = 0;
};

// One batch key as given: value is set when present and valid.
struct BatchInput {
  std::optional<int64_t> value;
  std::string dump;  // JSON text of the value, for messages
};

// Applies train_batch_size = micro × gas × world to whichever keys are given
// and derives the rest. Returns nullopt after adding problems to *out.
std::optional<BatchTriple> resolve_batch(const BatchInput& t,
                                         const BatchInput& m,
                                         const BatchInput& g, int64_t w,
                                         std::vector<ConfigProblem>* out) {
  auto overflow = [&](const std::string& key, const std::string& dump) {
    out->push_back({key, dump,
                    "makes micro × gas × world_size overflow a 64-bit integer",
                    "use smaller batch sizes"});
    return std::nullopt;
  };
  int64_t product = 0;
  if (t.value && m.value && g.value) {
    if (__builtin_mul_overflow(*m.value, *g.value, &product) ||
        __builtin_mul_overflow(product, w, &product)) {
      return overflow("train_batch_size", t.dump);
    }
    if (*t.value == product) return BatchTriple{*t.value, *m.value, *g.value};
    const std::string arithmetic =
        std::to_string(*m.value) + " × " + std::to_string(*g.value) + " × " +
        std::to_string(w) + " = " + std::to_string(product);
    out->push_back(
        {"train_batch_size", t.dump,
         "must equal train_micro_batch_size_per_gpu × "
         "gradient_accumulation_steps × world_size = " +
             arithmetic,
         "write " + std::to_string(product) + " (= micro " +
             std::to_string(*m.value) + " × gas " + std::to_string(*g.value) +
             " × world " + std::to_string(w) +
             "), or remove one of the three keys and let zerostep derive it"});
    return std::nullopt;
  }
  // train_batch_size with one of micro / gas: the other is
  // train_batch_size / (given × world), which must be whole.
  auto derive = [&](const BatchInput& given, const char* given_key,
                    const char* derived_key) -> std::optional<int64_t> {
    if (__builtin_mul_overflow(*given.value, w, &product)) {
      overflow(given_key, given.dump);
      return std::nullopt;
    }
    if (*t.value % product == 0) return *t.value / product;
    out->push_back(
        {"train_batch_size", t.dump,
         std::string("must be divisible by ") + given_key + " × world_size = " +
             std::to_string(*given.value) + " × " + std::to_string(w) + " = " +
             std::to_string(product) + " (" + derived_key +
             " = train_batch_size / " + std::to_string(product) + ")",
         "write a multiple of " + std::to_string(product) + ", " +
             multiples_near(*t.value, product)});
    return std::nullopt;
  };
  if (t.value && m.value) {
    const std::optional<int64_t> gas = derive(
        m, "train_micro_batch_size_per_gpu", "gradient_accumulation_steps");
    if (!gas) return std::nullopt;
    return BatchTriple{*t.value, *m.value, *gas};
  }
  if (t.value && g.value) {
    const std::optional<int64_t> micro = derive(
        g, "gradient_accumulation_steps", "train_micro_batch_size_per_gpu");
    if (!micro) return std::nullopt;
    return BatchTriple{*t.value, *micro, *g.value};
  }
  if (m.value && g.value) {
    if (__builtin_mul_overflow(*m.value, *g.value, &product) ||
        __builtin_mul_overflow(product, w, &product)) {
      return overflow("gradient_accumulation_steps", g.dump);
    }
    return BatchTriple{product, *m.value, *g.value};
  }
  if (m.value) {
    if (__builtin_mul_overflow(*m.value, w, &product)) {
      return overflow("train_micro_batch_size_per_gpu", m.dump);
    }
    return BatchTriple{product, *m.value, 1};
  }
  if (g.value) {
    out->push_back(
        {"train_micro_batch_size_per_gpu", "",
         "is required: gradient_accumulation_steps alone does not determine "
         "the batch size (" +
             std::string(kBatchRelation) + ")",
         "add train_micro_batch_size_per_gpu (samples per rank per "
         "backward) or train_batch_size"});
    return std::nullopt;
  }
  if (t.value) {
    if (*t.value % w == 0) return BatchTriple{*t.value, *t.value / w, 1};
    out->push_back(
        {"train_batch_size", t.dump,
         "must be divisible by world_size " + std::to_string(w) +
             " (without gradient_accumulation_steps it is 1, so "
             "train_micro_batch_size_per_gpu = train_batch_size / world_size)",
         "write a multiple of " + std::to_string(w) + ", " +
             multiples_near(*t.value, w) +
             ", or also give train_micro_batch_size_per_gpu"});
    return std::nullopt;
  }
  out->push_back(
      {"train_batch_size", "",
       "no batch size given: train_batch_size or "
       "train_micro_batch_size_per_gpu is required (" +
           std::string(kBatchRelation) +
           "; any two of the three determine the third)",
       "add \"train_micro_batch_size_per_gpu\": <samples per rank per "
       "backward>, and optionally gradient_accumulation_steps"});
  return std::nullopt;
}

}  // namespace

void BatchSection::parse_size(const std::string& key, const Json& v) {
  // null: DeepSpeed's default (None), which is what an absent key means.
  if (v.is_null()) return;
  Key& b = keys_[key == "train_batch_size"                 ? 0
                 : key == "train_micro_batch_size_per_gpu" ? 1
                                                           : 2];
  b.raw = &v;
  if (is_auto(v)) {
    // The fix needs the other batch keys; resolve() fills it in.
    b.auto_problem = report_->size();
    report_->add_auto(key, v, "");
    return;
  }
  auto n = report_->read_whole(key, v, "a positive integer, e.g. 4");
  if (!n) {
    b.bad = true;
  } else if (*n < 1) {
    report_->add(key, v.dump(), "must be a positive integer",
                 "write a positive integer, e.g. 4");
    b.bad = true;
  } else {
    b.value = *n;
  }
}

void BatchSection::parse_managed(const Json& v) {
  if (v.is_null()) {
    // DeepSpeed tests `not managed_gradient_accumulation()`: None is false.
    report_->add("managed_gradient_accumulation", "null",
                 "null is not the default here: DeepSpeed reads it as false "
                 "(the caller owns the accumulation boundary), while an "
                 "absent key means true",
                 "write true or false, or remove it for true");
    return;
  }
  if (auto b = report_->read_bool("managed_gradient_accumulation", v)) {
    managed_ = *b;
  }
}

void BatchSection::parse_scaling(const Json& v) {
  static const std::vector<std::string> kModes = {"configured",
                                                  "per_step_count", "none"};
  const std::string key = "gradient_accumulation_scaling";
  const std::string want =
      "one of \"configured\", \"per_step_count\", \"none\" (a JSON string)";
  if (!v.is_string() || is_auto(v)) {
    if (is_auto(v)) {
      report_->add_auto(key, v, "write " + want);
    } else {
      report_->add(key, v.dump(), "must be a JSON string", "write " + want);
    }
    return;
  }
  const std::string s = lower(v.get<std::string>());
  if (auto mode = grad_accum_scaling_from_string(s)) {
    scaling_ = *mode;
  } else {
    std::string guess = closest(s, {&kModes});
    report_->add(
        key, v.dump(), "must be \"configured\", \"per_step_count\" or \"none\"",
        guess.empty() ? "write " + want : "did you mean \"" + guess + "\"?");
  }
}

std::optional<BatchSizes> BatchSection::resolve(int world_size) {
  Key& t = keys_[0];
  Key& m = keys_[1];
  Key& g = keys_[2];
  if (world_size < 1) return std::nullopt;
  const int64_t w = world_size;
  auto input = [](const Key& k) {
    return BatchInput{k.value, k.raw ? k.raw->dump() : ""};
  };
  const bool any_bad = t.bad || m.bad || g.bad;
  const bool any_auto = t.auto_problem != SIZE_MAX ||
                        m.auto_problem != SIZE_MAX ||
                        g.auto_problem != SIZE_MAX;
  if (any_auto) {
    // Derive as if each "auto" key were absent; if that determines it,
    // the fix names the exact number.
    std::optional<BatchTriple> d;
    if (!any_bad) {
      std::vector<ConfigProblem> scratch;
      d = resolve_batch(input(t), input(m), input(g), w, &scratch);
    }
    const std::string generic = "write a positive integer (" +
                                std::string(kBatchRelation) +
                                ", with world_size = " + std::to_string(w) +
                                "; any two determine the third)";
    if (t.auto_problem != SIZE_MAX) {
      report_->problem(t.auto_problem).fix = auto_fix(
          "train_batch_size", d ? "write " + std::to_string(d->tbs) +
                                      " (= micro " + std::to_string(d->micro) +
                                      " × gas " + std::to_string(d->gas) +
                                      " × world " + std::to_string(w) + ")"
                                : generic);
    }
    if (m.auto_problem != SIZE_MAX) {
      report_->problem(m.auto_problem).fix = auto_fix(
          "train_micro_batch_size_per_gpu",
          d ? "write " + std::to_string(d->micro) + " (= train_batch_size " +
                  std::to_string(d->tbs) + " / (gas " + std::to_string(d->gas) +
                  " × world " + std::to_string(w) + "))"
            : generic);
    }
    if (g.auto_problem != SIZE_MAX) {
      report_->problem(g.auto_problem).fix =
          auto_fix("gradient_accumulation_steps",
                   d ? "write " + std::to_string(d->gas) +
                           " (= train_batch_size " + std::to_string(d->tbs) +
                           " / (micro " + std::to_string(d->micro) +
                           " × world " + std::to_string(w) + "))"
                     : generic);
    }
    return std::nullopt;
  }
  // A rejected batch key would only cascade into misleading arithmetic.
  if (any_bad) return std::nullopt;
  std::vector<ConfigProblem> found;
  std::optional<BatchTriple> r =
      resolve_batch(input(t), input(m), input(g), w, &found);
  for (ConfigProblem& p : found) {
    report_->add(std::move(p.key), std::move(p.value), std::move(p.rule),
                 std::move(p.fix));
  }
  if (!r) return std::nullopt;
  return BatchSizes{r->tbs, r->micro, r->gas};
}

std::optional<GradAccumScaling> grad_accum_scaling_from_string(
    const std::string& name) {
  const std::string s = lower(name);
  if (s == "configured") return GradAccumScaling::kConfigured;
  if (s == "per_step_count") return GradAccumScaling::kPerStepCount;
  if (s == "none") return GradAccumScaling::kNone;
  return std::nullopt;
}

const char* to_string(GradAccumScaling s) {
  switch (s) {
    case GradAccumScaling::kConfigured:
      return "configured";
    case GradAccumScaling::kPerStepCount:
      return "per_step_count";
    case GradAccumScaling::kNone:
      return "none";
  }
  return "unknown";
}

}  // namespace zerostep
