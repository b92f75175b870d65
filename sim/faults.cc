#include "sim/faults.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr const char* kGrammar =
    "expected a comma-separated list of crash:R@K, straggle:R@K[xN]:D, "
    "mismatch:R@K:op|dtype|count, lost:R@K, timeout:S (R rank, K collective "
    "index from 0, N collectives, D and S virtual seconds)";

// The shortest decimal text that parses back to exactly `x` ("60", not
// "6e+01").
std::string exact(double x) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, x);
    if (std::strtod(buf, nullptr) != x) continue;
    if (std::strstr(buf, "e+") != nullptr && std::fabs(x) < 1e15) continue;
    break;
  }
  return buf;
}

[[noreturn]] void bad(const std::string& item, const std::string& why) {
  throw UsageError("fault '" + item + "': " + why + "; " + kGrammar);
}

int64_t parse_int(const std::string& item, const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') bad(item, "'" + s + "' is not an integer");
  return v;
}

double parse_seconds(const std::string& item, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') bad(item, "'" + s + "' is not a number");
  return v;
}

// splitmix64: a tiny, well-mixed generator whose output depends only on
// the seed, on every platform.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n >= 1.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % n); }
};

}  // namespace

const char* to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::kCrash:
      return "crash";
    case FaultKind::kStraggle:
      return "straggle";
    case FaultKind::kMismatch:
      return "mismatch";
    case FaultKind::kLostPeer:
      return "lost";
  }
  return "?";
}

const char* to_string(MismatchField field) {
  switch (field) {
    case MismatchField::kOp:
      return "op";
    case MismatchField::kDtype:
      return "dtype";
    case MismatchField::kCount:
      return "count";
  }
  return "?";
}

bool Fault::hits(int r, int64_t seq) const {
  if (r != rank) return false;
  if (kind == FaultKind::kStraggle)
    return seq >= collective && seq < collective + count;
  return seq == collective;
}

std::string Fault::to_string() const {
  std::string s = std::string(zerostep::to_string(kind)) + ":" +
                  std::to_string(rank) + "@" + std::to_string(collective);
  switch (kind) {
    case FaultKind::kStraggle:
      if (count != 1) s += "x" + std::to_string(count);
      s += ":" + exact(delay_s);
      break;
    case FaultKind::kMismatch:
      s += std::string(":") + zerostep::to_string(field);
      break;
    default:
      break;
  }
  return s;
}

std::string FaultOptions::to_string() const {
  std::string s;
  for (const Fault& f : faults) s += f.to_string() + ",";
  return s + "timeout:" + exact(timeout_s);
}

FaultOptions parse_fault_options(const std::string& text) {
  FaultOptions out;
  if (text.empty() || text == "none") return out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) bad(item, "no ':'");
    const std::string kind = item.substr(0, colon);
    const std::string rest = item.substr(colon + 1);
    if (kind == "timeout") {
      out.timeout_s = parse_seconds(item, rest);
      continue;
    }
    Fault f;
    if (kind == "crash")
      f.kind = FaultKind::kCrash;
    else if (kind == "straggle")
      f.kind = FaultKind::kStraggle;
    else if (kind == "mismatch")
      f.kind = FaultKind::kMismatch;
    else if (kind == "lost")
      f.kind = FaultKind::kLostPeer;
    else
      bad(item, "unknown kind '" + kind + "'");
    const size_t at = rest.find('@');
    if (at == std::string::npos) bad(item, "no '@'");
    f.rank = static_cast<int>(parse_int(item, rest.substr(0, at)));
    std::string where = rest.substr(at + 1);
    std::string arg;
    const size_t c2 = where.find(':');
    if (c2 != std::string::npos) {
      arg = where.substr(c2 + 1);
      where = where.substr(0, c2);
    }
    if (f.kind == FaultKind::kStraggle) {
      const size_t x = where.find('x');
      if (x != std::string::npos) {
        f.count = parse_int(item, where.substr(x + 1));
        where = where.substr(0, x);
      }
      if (arg.empty()) bad(item, "a straggle needs its delay (':D')");
      f.delay_s = parse_seconds(item, arg);
    } else if (f.kind == FaultKind::kMismatch) {
      if (arg == "op")
        f.field = MismatchField::kOp;
      else if (arg == "dtype")
        f.field = MismatchField::kDtype;
      else if (arg == "count")
        f.field = MismatchField::kCount;
      else
        bad(item, "mismatch field '" + arg + "' is not op, dtype or count");
    } else if (!arg.empty()) {
      bad(item, "unexpected ':" + arg + "'");
    }
    f.collective = parse_int(item, where);
    out.faults.push_back(f);
  }
  return out;
}

void validate(const FaultOptions& o, int world_size) {
  if (!(o.timeout_s > 0))
    throw UsageError("fault option timeout:" + exact(o.timeout_s) +
                     " must be > 0 virtual seconds");
  for (const Fault& f : o.faults) {
    const std::string item = f.to_string();
    if (f.rank < 0 || f.rank >= world_size)
      bad(item, "rank " + std::to_string(f.rank) +
                    " is not a rank of this "
                    "world of " +
                    std::to_string(world_size));
    if (f.collective < 0) bad(item, "the collective index must be >= 0");
    if (f.count < 1) bad(item, "a straggle covers at least 1 collective");
    if (f.delay_s < 0) bad(item, "the delay must be >= 0");
    if (f.kind == FaultKind::kMismatch && world_size < 2)
      bad(item, "a mismatch needs at least 2 ranks to disagree");
  }
}

FaultOptions draw_fault_options(uint64_t seed, int world_size,
                                int64_t collectives) {
  SplitMix rng{seed ^ 0xfa017fa017ull};
  FaultOptions o;
  const int64_t span = collectives > 0 ? collectives : 1;
  const int n = 1 + static_cast<int>(rng.below(3));
  for (int i = 0; i < n; ++i) {
    Fault f;
    const int kinds = world_size >= 2 ? 4 : 3;
    const int64_t k = rng.below(kinds);
    f.kind = k == 0   ? FaultKind::kCrash
             : k == 1 ? FaultKind::kStraggle
             : k == 2 ? FaultKind::kLostPeer
                      : FaultKind::kMismatch;
    f.rank = static_cast<int>(rng.below(world_size));
    f.collective = rng.below(span);
    if (f.kind == FaultKind::kStraggle) {
      f.count = 1 + rng.below(3);
      // 1 ms .. 2 × timeout, in whole milliseconds.
      f.delay_s =
          static_cast<double>(
              1 + rng.below(static_cast<int64_t>(2 * o.timeout_s * 1000))) /
          1000.0;
    }
    if (f.kind == FaultKind::kMismatch)
      f.field = static_cast<MismatchField>(rng.below(3));
    o.faults.push_back(f);
  }
  return o;
}

}  // namespace zerostep
