// The safetensors file format (the one Hugging Face, PyTorch and inference
// stacks read), encoded and decoded in memory. Torch-free; the Engine
// (engine/checkpoint.cc) decides what goes in and where it comes from.
//
// A file is: an 8-byte little-endian uint64 N; N bytes of a UTF-8 JSON
// object mapping each tensor's name to {"dtype": "F32", "shape": [d0, ...],
// "data_offsets": [begin, end]}, and optionally "__metadata__" to an object
// of string values; then the data: each tensor's little-endian, row-major
// bytes at [begin, end) counted from the first byte after the header.
//
// Note [Safetensors layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// encode_safetensors() writes the header's entries in the order given (an
// ordered JSON object), lays the tensors out in that order without gaps,
// and pads the header with spaces to a multiple of 8 bytes, as the
// reference writer does, so the data starts 8-aligned. decode_safetensors()
// applies the reference reader's rules: the header size must fit the file
// (and be at most kSafetensorsHeaderBytesMax), the header must be one JSON
// object (starting with '{', trailing spaces allowed) without duplicate
// names, every dtype one of the format's byte-sized ones (the sub-byte F4
// and F6 types are refused as unknown), every shape's element
// count times the dtype's size equal to end - begin, and the tensors,
// sorted by begin, must cover the data exactly: starting at 0, no gaps, no
// overlaps, and no bytes after the last one.
//
// Errors: IoError naming `path` (for messages only; nothing is read here)
// and the rule broken, with the tensor's name where there is one.
//
// Thread safety: the functions are pure; the structs are plain values.
#ifndef ZEROSTEP_ENGINE_SAFETENSORS_H_
#define ZEROSTEP_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zerostep {

// The reference reader's limit on the header (100 MB): a larger length is
// taken for a corrupt file rather than allocated.
inline constexpr uint64_t kSafetensorsHeaderBytesMax = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  // The format's dtype name: "F32", "BF16", "F16", "I64", ...
  std::string dtype;
  std::vector<uint64_t> shape;  // empty: a scalar (one element)
  std::string data;             // the raw little-endian bytes
};

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;  // encode: in this order
  // "__metadata__"; omitted from the header when empty.
  std::map<std::string, std::string> metadata;
};

// The size in bytes of one element of the format's dtype `dtype`; 0 if the
// format has no such dtype.
size_t safetensors_dtype_bytes(const std::string& dtype);

// The file's bytes (Note [Safetensors layout]). IoError naming `path` if a
// tensor's data does not match its dtype and shape, a dtype is unknown, a
// name is empty, repeated or "__metadata__".
std::string encode_safetensors(const SafetensorsFile& file,
                               const std::string& path);

// Parses and verifies a file's bytes read from `path` (Note [Safetensors
// layout]); tensors in the order of their data. IoError naming `path` and
// the rule broken.
SafetensorsFile decode_safetensors(const std::string& bytes,
                                   const std::string& path);

// A file's header alone, for readers that fetch tensors' bytes from the
// file as they need them (engine/hf_checkpoint.h) instead of reading it
// whole.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes [begin, end) of the data
};
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data starts in the file: 8 + N
};

// The header's length N from the file's first 8 bytes (`first_bytes` holds
// at least 8), checked against the file's size `file_bytes` and
// kSafetensorsHeaderBytesMax. IoError naming `path` otherwise.
uint64_t safetensors_header_length(const std::string& first_bytes,
                                   uint64_t file_bytes,
                                   const std::string& path);
// Parses and verifies the N header bytes `header_json` of a file of
// `file_bytes` bytes: every rule of Note [Safetensors layout], the data
// being the file's last file_bytes - 8 - N bytes. IoError naming `path`.
SafetensorsHeader parse_safetensors_header(const std::string& header_json,
                                           uint64_t file_bytes,
                                           const std::string& path);

// float32 -> bfloat16 bits, rounded to nearest, ties to even (as
// LibTorch's conversion); NaN stays NaN (quiet, sign kept).
uint16_t float_to_bf16(float value);
// bfloat16 bits -> float32 (exact).
float bf16_to_float(uint16_t bits);
// IEEE binary16 bits -> float32 (exact: subnormals, infinities and NaN
// payloads included).
float f16_to_float(uint16_t bits);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_SAFETENSORS_H_
