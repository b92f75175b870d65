// Reading the fields of a JSON request (Command::args): a missing or null
// field takes its default, a field of the wrong type is a UsageError that
// names it. Header-only, torch-free.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_
#define ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_

#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace tinker {

// j[key] as a T; `fallback` when j is not an object or the key is absent or
// null. UsageError naming the key when the value is not a T.
template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(std::string("field '") + key +
                     "' has the wrong type: " + j[key].dump());
  }
}

// j[key], which must be a string (UsageError naming the key otherwise).
inline std::string require_string(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    throw UsageError(std::string("missing string field '") + key + "'");
  return j[key].get<std::string>();
}

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_
