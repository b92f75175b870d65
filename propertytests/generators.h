// What the property suites' generators share: closed integer ranges drawn
// uniformly from the first case, and the sampling their coverage tests use
// to show that a generator reaches every value its property claims.
//
// Note [Closed ranges]
// ~~~~~~~~~~~~~~~~~~~~
// rc::gen::inRange(min, max) leaves `max` out. Drawn as `inRange(0, 3)` for
// "stages 0-3", a property never ran stage 3, and nothing said so (issue
// 48). Properties here draw with uniform_closed(min, max), whose bounds are
// the ones the property's comment names, and each suite has a coverage
// test (Generators.*) that samples its generators a few thousand times
// and compares the values reached with the values claimed.
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_PROPERTYTESTS_GENERATORS_H_
#define ZEROSTEP_PROPERTYTESTS_GENERATORS_H_

#include <rapidcheck.h>

#include <cstdint>
#include <set>
#include <vector>

namespace zerostep {

// Uniform over [min, max], both included (Note [Closed ranges]).
// rc::gen::inRange scales its range with RapidCheck's size, which starts at
// 0 and grows over the run, so with a small max_success most cases would
// get the low end of every range (stage 0, world 1, GAS 1). The parameters
// drawn here are few and small: they are drawn at full size from the first
// case. Shrinking still moves towards `min`.
template <typename T>
rc::Gen<T> uniform_closed(T min, T max) {
  return rc::gen::resize(rc::kNominalSize,
                         rc::gen::inRange<T>(min, static_cast<T>(max + 1)));
}

// `count` values of `gen`, from a fixed seed, at the sizes a property's
// run gives its cases (RapidCheck spreads them evenly over 0..100).
template <typename T>
std::vector<T> sample_draws(const rc::Gen<T>& gen, int count,
                            uint64_t seed = 48) {
  rc::Random random(seed);
  std::vector<T> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    out.push_back(gen(random.split(), i % (rc::kNominalSize + 1)).value());
  return out;
}

// The distinct values of key(draw) over the draws, for comparing with the
// values a property claims.
template <typename T, typename Key>
auto values_of(const std::vector<T>& draws, Key key) {
  std::set<decltype(key(draws.front()))> seen;
  for (const T& d : draws) seen.insert(key(d));
  return seen;
}

// {min, ..., max}: the values a closed range claims.
inline std::set<int> ints_in(int min, int max) {
  std::set<int> out;
  for (int v = min; v <= max; ++v) out.insert(v);
  return out;
}

}  // namespace zerostep

#endif  // ZEROSTEP_PROPERTYTESTS_GENERATORS_H_
