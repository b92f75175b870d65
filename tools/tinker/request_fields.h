// Reading the fields of a JSON request (Command::args): a missing field
// takes its default, a field of the wrong type is a UsageError that names
// it. A numeric field that is null or not finite is a UsageError too, never
// its default: the SDK sends NaN and infinity as JSON null (and drops the
// fields it leaves unset), so a null number is a bad value, not a missing
// one. A null field of any other type takes its default. A number is never
// read from a boolean, and an integer field is never rounded or wrapped
// (Note [Integer fields]). Header-only, torch-free.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_
#define ZEROSTEP_TOOLS_TINKER_REQUEST_FIELDS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "common/errors.h"

namespace zerostep {
namespace tinker {

// Note [Integer fields]
// ~~~~~~~~~~~~~~~~~~~~~
// nlohmann's get<int64_t>() converts whatever number it finds: 2.5 becomes
// 2, 1e30 is undefined behaviour, -1 read as a uint64_t and an integer
// above 2^63 - 1 read as an int64_t wrap around, and true is 1. A client
// that sends num_samples 2.5 or lora_config.rank 8.9 would then be served
// something it did not ask for. So an integer field must hold an integer
// that its type holds: a JSON integer in range, or a float with no
// fractional part in range (2.0 is 2; some clients write every number as a
// float). Anything else is a UsageError naming the field, the value and
// the range.

// Whether v is a JSON integer that an int64_t holds (nlohmann keeps an
// integer above 2^63 - 1 as unsigned, and get<int64_t>() would wrap it).
inline bool is_int64(const nlohmann::json& v) {
  return v.is_number_integer() &&
         !(v.is_number_unsigned() &&
           v.get<uint64_t>() >
               static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

// j[key] into *out when it is an integer that an int64_t holds; false
// (and *out untouched) otherwise, the key missing included.
inline bool get_int64(const nlohmann::json& j, const char* key, int64_t* out) {
  if (!j.is_object() || !j.contains(key) || !is_int64(j[key])) return false;
  *out = j[key].get<int64_t>();
  return true;
}

namespace internal {

// v (a number, not null, finite) as the integer type T; UsageError naming
// `name` when it has a fractional part or T does not hold it.
template <typename T>
T integer_field(const nlohmann::json& v, const std::string& name) {
  using Limits = std::numeric_limits<T>;
  const std::string range = "an integer from " + std::to_string(Limits::min()) +
                            " to " + std::to_string(Limits::max());
  const auto bad = [&](const char* why) {
    return UsageError(name + " = " + v.dump() + " " + why + ": it must be " +
                      range + ". Nothing was changed");
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(Limits::max())) throw bad("is out of range");
    return static_cast<T>(u);
  }
  if (v.is_number_integer()) {  // signed storage
    const int64_t i = v.get<int64_t>();
    bool in_range = i >= 0;
    if constexpr (Limits::is_signed)
      in_range = i >= static_cast<int64_t>(Limits::min());
    if constexpr (Limits::digits < 63)
      in_range = in_range && i <= static_cast<int64_t>(Limits::max());
    if (!in_range) throw bad("is out of range");
    return static_cast<T>(i);
  }
  const double d = v.get<double>();
  if (d != std::trunc(d)) throw bad("is not a whole number");
  // [min, 2^digits): both ends exact in a double.
  if (d < static_cast<double>(Limits::min()) ||
      d >= std::ldexp(1.0, Limits::digits))
    throw bad("is out of range");
  return static_cast<T>(d);
}

}  // namespace internal

// j[key] as a T; `fallback` when j is not an object or the key is absent,
// or (T not a number: bool, string, ...) null. UsageError naming `where` + key
// when the value is not a T (a boolean is not a number), or T is a number
// (not bool) and the value is null or not finite, or T is an integer type
// and the value is not a whole number that T holds (Note [Integer fields]).
template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback,
         const std::string& where = "") {
  constexpr bool kNumber =
      std::is_arithmetic<T>::value && !std::is_same<T, bool>::value;
  if (!j.is_object() || !j.contains(key)) return fallback;
  const nlohmann::json& v = j[key];
  const std::string name = "field '" + where + key + "'";
  if (v.is_null()) {
    if (!kNumber) return fallback;
    throw UsageError(name +
                     " is null: it must be a finite number (the SDK sends "
                     "NaN and infinity as null). Nothing was changed");
  }
  if constexpr (kNumber) {
    if (!v.is_number())
      throw UsageError(name + " has the wrong type: " + elide(v.dump(), 80) +
                       " (it must be a number)");
    if (v.is_number_float() && !std::isfinite(v.get<double>()))
      throw UsageError(name + " = " + v.dump() +
                       " must be a finite number. Nothing was changed");
    if constexpr (std::is_integral<T>::value)
      return internal::integer_field<T>(v, name);
    else
      return v.get<T>();
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw UsageError(name + " has the wrong type: " + elide(v.dump(), 80));
    }
  }
}

// j[key] when it is an object; nullptr when j is not an object, the key is
// absent or its value is null (the SDK's None). UsageError naming `where` +
// key when it is anything else: a client's "lora_config": 8 is never read
// as no LoRA at all.
inline const nlohmann::json* get_object(const nlohmann::json& j,
                                        const char* key,
                                        const std::string& where = "") {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return nullptr;
  const nlohmann::json& v = j[key];
  if (!v.is_object())
    throw UsageError("field '" + where + key + "' must be an object; got " +
                     elide(v.dump(), 80) + ". Nothing was changed");
  return &v;
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
