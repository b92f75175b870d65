// Reading the fields of a JSON request (Command::args): a missing field
// takes its default, a field of the wrong type is a UsageError that names
// it. A numeric field that is null or not finite is a UsageError too, never
// its default: the SDK sends NaN and infinity as JSON null (and drops the
// fields it leaves unset), so a null number is a bad value, not a missing
// one. A null field of any other type takes its default. Header-only,
// torch-free.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_
#define ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "common/errors.h"

namespace zerostep {
namespace tinker {

// j[key] as a T; `fallback` when j is not an object or the key is absent,
// or (T not a number: bool, string, ...) null. UsageError naming `where` + key
// when the value is not a T, or T is a number (not bool) and the value is null
// or not finite.
template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback,
         const std::string& where = "") {
  if (!j.is_object() || !j.contains(key)) return fallback;
  const nlohmann::json& v = j[key];
  const std::string name = "field '" + where + key + "'";
  if (v.is_null()) {
    if (!std::is_arithmetic<T>::value || std::is_same<T, bool>::value)
      return fallback;
    throw UsageError(name +
                     " is null: it must be a finite number (the SDK sends "
                     "NaN and infinity as null). Nothing was changed");
  }
  T out;
  try {
    out = v.get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(name + " has the wrong type: " + v.dump());
  }
  if (v.is_number_float() && !std::isfinite(v.get<double>()))
    throw UsageError(name + " = " + v.dump() +
                     " must be a finite number. Nothing was changed");
  return out;
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
