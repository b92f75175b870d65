#include "engine/hf_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "engine/safetensors.h"

namespace zerostep {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; read() copies it as is");

// Elements converted per chunk for BF16 and F16 (a 128 KiB buffer).
constexpr int64_t kChunkElements = 64 * 1024;

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw IoError("cannot read '" + path + "'");
  return s.str();
}

// Reads exactly `bytes` bytes at `offset`; IoError on an error or a short
// file.
void pread_all(int fd, const std::string& path, char* out, uint64_t bytes,
               uint64_t offset) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read '" + path + "' at byte " +
                    std::to_string(offset) + ": " + std::strerror(errno));
    }
    if (n == 0)
      throw IoError("'" + path + "' ends at byte " + std::to_string(offset) +
                    " (truncated since it was opened?)");
    out += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

int64_t HfTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool hf_float_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

SafetensorsFile read_safetensors_file(const std::string& path) {
  return decode_safetensors(read_text(path), path);
}

HfCheckpointSource::HfCheckpointSource(const std::string& dir) : dir_(dir) {
  const std::string index_path = join(dir, kHfWeightsIndexFile);
  const std::string single_path = join(dir, kHfWeightsFile);
  // Tensor name -> file, and the files in the order first named.
  std::map<std::string, std::string> file_of;
  std::vector<std::string> files;
  const bool indexed = exists(index_path);
  if (indexed) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_text(index_path));
    } catch (const nlohmann::json::exception& e) {
      throw IoError("'" + index_path + "' is not valid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object())
      throw IoError("'" + index_path +
                    "' has no \"weight_map\" object (a sharded checkpoint's "
                    "index maps every tensor name to its shard file)");
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos)
        throw IoError("'" + index_path + "' maps tensor '" + name + "' to " +
                      elide(file.dump(), 200) +
                      ", not the name of a file in the folder");
      const std::string path = join(dir, file.get<std::string>());
      if (std::find(files.begin(), files.end(), path) == files.end())
        files.push_back(path);
      file_of[name] = path;
    }
  } else if (exists(single_path)) {
    files.push_back(single_path);
  } else {
    throw IoError("'" + dir + "' holds neither " + kHfWeightsFile + " nor " +
                  kHfWeightsIndexFile +
                  " (a Hugging Face model folder, as save_pretrained writes "
                  "it, has one of them)");
  }
  try {
    for (const std::string& path : files) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        throw IoError("cannot open '" + path + "': " + std::strerror(errno));
      fds_[path] = fd;
      struct stat st;
      if (::fstat(fd, &st) != 0)
        throw IoError("cannot stat '" + path + "': " + std::strerror(errno));
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      std::string first(8, '\0');
      if (size >= 8) pread_all(fd, path, first.data(), 8, 0);
      const uint64_t n = safetensors_header_length(first, size, path);
      std::string json(n, '\0');
      pread_all(fd, path, json.data(), n, 8);
      const SafetensorsHeader header =
          parse_safetensors_header(json, size, path);
      for (const SafetensorsEntry& e : header.tensors) {
        // Sharded: the index decides which file holds a name (a tensor it
        // does not place in this file is not read from it).
        if (indexed) {
          const auto it = file_of.find(e.name);
          if (it == file_of.end() || it->second != path) continue;
        }
        HfTensorInfo info;
        info.file = path;
        info.dtype = e.dtype;
        for (uint64_t d : e.shape) info.shape.push_back(static_cast<int64_t>(d));
        info.file_offset = header.data_offset + e.begin;
        tensors_[e.name] = std::move(info);
      }
    }
    for (const auto& [name, path] : file_of)
      if (tensors_.count(name) == 0 || tensors_.at(name).file != path)
        throw IoError("'" + index_path + "' places tensor '" + name +
                      "' in '" + path + "', which does not hold it");
  } catch (...) {
    for (const auto& [path, fd] : fds_) ::close(fd);
    throw;
  }
}

HfCheckpointSource::~HfCheckpointSource() {
  for (const auto& [path, fd] : fds_) ::close(fd);
}

const HfTensorInfo& HfCheckpointSource::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw UsageError("the checkpoint in '" + dir_ + "' has no tensor '" +
                     name + "' (it has " + std::to_string(tensors_.size()) +
                     " tensors)");
  return it->second;
}

void HfCheckpointSource::read(const std::string& name, int64_t offset,
                              int64_t numel, float* out) const {
  const HfTensorInfo& t = tensor(name);
  const int64_t total = t.numel();
  if (offset < 0 || numel < 0 || offset > total || numel > total - offset)
    throw UsageError("elements [" + std::to_string(offset) + ", " +
                     std::to_string(offset) + " + " + std::to_string(numel) +
                     ") of tensor '" + name + "' in '" + dir_ +
                     "' are outside its " + std::to_string(total) +
                     " elements");
  if (!hf_float_dtype(t.dtype))
    throw UsageError("tensor '" + name + "' in '" + t.file + "' is " +
                     t.dtype + "; a parameter is read from F32, BF16 or F16");
  if (numel == 0) return;
  const int fd = fds_.at(t.file);
  const uint64_t element = safetensors_dtype_bytes(t.dtype);
  const uint64_t start = t.file_offset + static_cast<uint64_t>(offset) * element;
  if (t.dtype == "F32") {
    pread_all(fd, t.file, reinterpret_cast<char*>(out),
              static_cast<uint64_t>(numel) * 4, start);
    return;
  }
  const bool bf16 = t.dtype == "BF16";
  std::vector<uint16_t> chunk(
      static_cast<size_t>(std::min(numel, kChunkElements)));
  for (int64_t done = 0; done < numel;) {
    const int64_t n = std::min(numel - done, kChunkElements);
    pread_all(fd, t.file, reinterpret_cast<char*>(chunk.data()),
              static_cast<uint64_t>(n) * 2,
              start + static_cast<uint64_t>(done) * 2);
    for (int64_t i = 0; i < n; ++i)
      out[done + i] = bf16 ? bf16_to_float(chunk[i]) : f16_to_float(chunk[i]);
    done += n;
  }
}

}  // namespace zerostep
