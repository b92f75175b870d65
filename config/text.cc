#include "config/text.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace zerostep {
namespace config_text {

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(
    const std::string& word,
    std::initializer_list<const std::vector<std::string>*> candidate_lists) {
  if (word.size() > 100) return "";
  const std::string w = lower(word);
  const size_t limit = std::max<size_t>(2, w.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::vector<std::string>* list : candidate_lists) {
    for (const std::string& c : *list) {
      size_t d = levenshtein(w, lower(c));
      if (d < best_distance) {
        best_distance = d;
        best = c;
      }
    }
  }
  return best;
}

size_t nesting_depth(const std::string& text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

bool looks_numeric(const std::string& s) {
  // strtod also takes " 4", "nan" and "inf", which are not JSON numbers.
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) ||
                     s[0] == '-' || s[0] == '.')) {
    return false;
  }
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace config_text
}  // namespace zerostep
