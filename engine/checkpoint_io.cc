#include "engine/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr char kMagic[9] = "ZSCKPT01";

std::string dirname_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw IoError(what + " '" + path + "': " + std::strerror(errno));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t get_u64(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

void put_floats(std::string& out, const std::vector<float>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

void make_dirs(const std::string& path) {
  std::string at;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') at = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    at += part + "/";
    if (mkdir(at.c_str(), 0755) != 0 && errno != EEXIST)
      io_fail("cannot create folder", at);
  }
}

void atomic_write_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_fail("cannot write", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      close(fd);
      unlink(tmp.c_str());
      errno = saved;
      io_fail("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int saved = errno;
    close(fd);
    unlink(tmp.c_str());
    errno = saved;
    io_fail("cannot fsync", tmp);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(tmp.c_str());
    errno = saved;
    io_fail("cannot rename into place", path);
  }
  const std::string dir = dirname_of(path);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) io_fail("cannot read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string encode_rank_state(const RankState& s) {
  nlohmann::json h;
  h["rank"] = s.rank;
  h["numel"] = s.params.size();
  h["exp_avg"] = s.exp_avg.size();
  h["exp_avg_sq"] = s.exp_avg_sq.size();
  nlohmann::json segs = nlohmann::json::array();
  for (const Segment& g : s.segments)
    segs.push_back({g.state_offset, g.canonical_offset, g.numel});
  h["segments"] = segs;
  const std::string header = h.dump();
  std::string out(kMagic, 8);
  put_u64(out, header.size());
  out += header;
  put_floats(out, s.params);
  put_floats(out, s.exp_avg);
  put_floats(out, s.exp_avg_sq);
  put_u64(out, fnv1a64(out.data(), out.size()));
  return out;
}

RankState decode_rank_state(const std::string& in, const std::string& path) {
  auto corrupt = [&](const std::string& why) -> IoError {
    return IoError("checkpoint file '" + path + "' is corrupt: " + why +
                   ". Fix: load another checkpoint (nothing was changed)");
  };
  if (in.size() < 24 || in.compare(0, 8, kMagic) != 0)
    throw corrupt("not a zerostep rank file (bad magic or too short)");
  const uint64_t stored = get_u64(in, in.size() - 8);
  if (fnv1a64(in.data(), in.size() - 8) != stored)
    throw corrupt("checksum mismatch (truncated or modified)");
  const uint64_t header_len = get_u64(in, 8);
  if (16 + header_len > in.size() - 8) throw corrupt("header runs past the end");
  RankState s;
  size_t at = 16 + header_len;
  try {
    nlohmann::json h = nlohmann::json::parse(in.substr(16, header_len));
    s.rank = h.at("rank").get<int>();
    const size_t n = h.at("numel").get<size_t>();
    const size_t m = h.at("exp_avg").get<size_t>();
    const size_t v = h.at("exp_avg_sq").get<size_t>();
    for (const auto& g : h.at("segments"))
      s.segments.push_back({g.at(0).get<size_t>(), g.at(1).get<size_t>(),
                            g.at(2).get<size_t>()});
    if (at + (n + m + v) * sizeof(float) != in.size() - 8)
      throw corrupt("array sizes do not match the file size");
    auto take = [&](size_t count) {
      std::vector<float> out(count);
      std::memcpy(out.data(), in.data() + at, count * sizeof(float));
      at += count * sizeof(float);
      return out;
    };
    s.params = take(n);
    s.exp_avg = take(m);
    s.exp_avg_sq = take(v);
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(std::string("bad header: ") + e.what());
  }
  for (const Segment& g : s.segments)
    if (g.state_offset + g.numel > s.params.size())
      throw corrupt("a segment lies outside the stored parameters");
  return s;
}

}  // namespace zerostep
