#include "engine/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr const char* kMetadataKey = "__metadata__";
// The longest name or value an error message quotes.
constexpr size_t kQuotedBytesMax = 200;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IoError("safetensors file '" + path + "' " + what);
}

std::string in_quotes(const std::string& s) {
  return "'" + elide(s, kQuotedBytesMax) + "'";
}

// The element count of `shape`; false on overflow of 64 bits.
bool element_count(const std::vector<uint64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

// Checks `t` against its dtype and shape; the byte count on success.
uint64_t checked_bytes(const std::string& path, const std::string& name,
                       const std::string& dtype,
                       const std::vector<uint64_t>& shape) {
  const size_t element = safetensors_dtype_bytes(dtype);
  if (element == 0)
    fail(path, "gives tensor " + in_quotes(name) + " the unknown dtype " +
                   in_quotes(dtype) +
                   " (the format's are BOOL, U8, I8, I16, U16, I32, U32, I64, "
                   "U64, F8_E4M3, F8_E5M2, F8_E8M0, F16, BF16, F32, F64, C64)");
  uint64_t numel = 0;
  if (!element_count(shape, &numel) || numel > UINT64_MAX / element)
    fail(path, "gives tensor " + in_quotes(name) +
                   " a shape whose byte count overflows 64 bits");
  return numel * element;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> kBytes = {
      {"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},     {"BF16", 2},
      {"I32", 4},     {"U32", 4}, {"F32", 4}, {"I64", 8},     {"U64", 8},
      {"F64", 8},     {"C64", 8}};
  const auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

std::string encode_safetensors(const SafetensorsFile& file,
                               const std::string& path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : file.tensors) {
    if (t.name.empty() || t.name == kMetadataKey)
      fail(path, "cannot hold a tensor named " + in_quotes(t.name));
    if (!names.insert(t.name).second)
      fail(path, "cannot hold two tensors named " + in_quotes(t.name));
    const uint64_t bytes = checked_bytes(path, t.name, t.dtype, t.shape);
    if (bytes != t.data.size())
      fail(path, "cannot hold tensor " + in_quotes(t.name) + ": " + t.dtype +
                     " of shape " + shape_string(t.shape) + " is " +
                     std::to_string(bytes) + " bytes, its data " +
                     std::to_string(t.data.size()));
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(n >> (8 * b)));
  out += json;
  for (const SafetensorsTensor& t : file.tensors) out += t.data;
  return out;
}

uint64_t safetensors_header_length(const std::string& first_bytes,
                                   uint64_t file_bytes,
                                   const std::string& path) {
  if (file_bytes < 8 || first_bytes.size() < 8)
    fail(path, "is " + std::to_string(file_bytes) +
                   " bytes, shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(first_bytes[b]))
         << (8 * b);
  if (n > kSafetensorsHeaderBytesMax || n > file_bytes - 8)
    fail(path, "has a bad header length " + std::to_string(n) + ": the file " +
                   "has " + std::to_string(file_bytes - 8) +
                   " bytes after it (and a header is at most " +
                   std::to_string(kSafetensorsHeaderBytesMax) + ")");
  return n;
}

SafetensorsHeader parse_safetensors_header(const std::string& text,
                                           uint64_t file_bytes,
                                           const std::string& path) {
  const uint64_t n = text.size();
  ZS_CHECK(file_bytes >= 8 + n);
  if (text.empty() || text[0] != '{')
    fail(path, "has a header that is not a JSON object");
  // nlohmann keeps the last of two equal keys: count them as they come.
  std::set<std::string> seen;
  std::string duplicate;
  const auto count_keys = [&](int depth, nlohmann::json::parse_event_t event,
                              nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, count_keys);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("has a header that is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "has a header that is not a JSON object");
  if (!duplicate.empty())
    fail(path, "names tensor " + in_quotes(duplicate) + " twice in its header");

  SafetensorsHeader out;
  out.data_offset = 8 + n;
  std::vector<SafetensorsEntry>& entries = out.tensors;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object())
        fail(path, "has a \"__metadata__\" that is not an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string())
          fail(path, "has a \"__metadata__\" value " + in_quotes(key) +
                         " that is not a string");
        out.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& rule) {
      fail(path, "has a bad entry for tensor " + in_quotes(name) + ": " + rule);
    };
    if (!value.is_object()) bad("not an object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!value.contains(key)) bad(std::string("no \"") + key + "\"");
    SafetensorsEntry e;
    e.name = name;
    if (!value["dtype"].is_string()) bad("\"dtype\" is not a string");
    e.dtype = value["dtype"].get<std::string>();
    const nlohmann::json& shape = value["shape"];
    if (!shape.is_array()) bad("\"shape\" is not an array");
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_unsigned())
        bad("\"shape\" holds " + elide(d.dump(), kQuotedBytesMax) +
            ", not a non-negative integer");
      e.shape.push_back(d.get<uint64_t>());
    }
    const nlohmann::json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      bad("\"data_offsets\" is not two non-negative integers");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end)
      bad("\"data_offsets\" [" + std::to_string(e.begin) + ", " +
          std::to_string(e.end) + "] end before they begin");
    const uint64_t expected = checked_bytes(path, name, e.dtype, e.shape);
    if (e.end - e.begin != expected)
      bad(e.dtype + " of shape " + shape_string(e.shape) + " is " +
          std::to_string(expected) + " bytes, but \"data_offsets\" [" +
          std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
          std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }
  // Sorted by where they begin (ties: the empty first), the tensors must
  // tile the data exactly.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin
                                               : a.end < b.end;
                   });
  const uint64_t data_bytes = file_bytes - 8 - n;
  uint64_t at = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::string range =
        "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.end > data_bytes)
      fail(path, "places tensor " + in_quotes(e.name) + " at " + range +
                     ", beyond its " + std::to_string(data_bytes) +
                     " bytes of data (truncated?)");
    if (e.begin < at)
      fail(path, "places tensor " + in_quotes(e.name) + " at " + range +
                     ", overlapping the tensor before it (which ends at " +
                     std::to_string(at) + ")");
    if (e.begin > at)
      fail(path, "leaves bytes [" + std::to_string(at) + ", " +
                     std::to_string(e.begin) + ") of its data unused, before " +
                     "tensor " + in_quotes(e.name));
    at = e.end;
  }
  if (at != data_bytes)
    fail(path, "has " + std::to_string(data_bytes - at) +
                   " trailing bytes after its last tensor (its tensors end "
                   "at data byte " +
                   std::to_string(at) + " of " + std::to_string(data_bytes) +
                   ")");
  return out;
}

SafetensorsFile decode_safetensors(const std::string& bytes,
                                   const std::string& path) {
  const uint64_t n = safetensors_header_length(bytes, bytes.size(), path);
  SafetensorsHeader header =
      parse_safetensors_header(bytes.substr(8, n), bytes.size(), path);
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  const char* data = bytes.data() + header.data_offset;
  for (SafetensorsEntry& e : header.tensors)
    out.tensors.push_back({std::move(e.name), std::move(e.dtype),
                           std::move(e.shape),
                           std::string(data + e.begin, e.end - e.begin)});
  return out;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it one, quietly
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1f) {  // infinity or NaN: the payload moves up
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    wide = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    wide = sign;
  } else {  // subnormal: normalize (a float32 holds it exactly)
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

}  // namespace zerostep
