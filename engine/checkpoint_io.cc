#include "engine/checkpoint_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "common/log.h"

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
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i]))
         << (8 * i);
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

namespace {

class PosixCheckpointFiles final : public CheckpointFiles {
 public:
  void write(const std::string& path, const std::string& bytes) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) io_fail("cannot write", path);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int saved = errno;
        close(fd);
        unlink(path.c_str());
        errno = saved;
        io_fail("cannot write", path);
      }
      done += static_cast<size_t>(n);
    }
    if (close(fd) != 0) io_fail("cannot write", path);
  }
  void sync_file(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) io_fail("cannot open for fsync", path);
    if (fsync(fd) != 0) {
      const int saved = errno;
      close(fd);
      errno = saved;
      io_fail("cannot fsync", path);
    }
    close(fd);
  }
  void sync_folder(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) io_fail("cannot open folder for fsync", path);
    // Some file systems refuse fsync on a folder (EINVAL): nothing to do.
    if (fsync(fd) != 0 && errno != EINVAL) {
      const int saved = errno;
      close(fd);
      errno = saved;
      io_fail("cannot fsync folder", path);
    }
    close(fd);
  }
  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      io_fail("cannot rename '" + from + "' to", to);
  }
  void make_folder(const std::string& path) override {
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      io_fail("cannot create folder", path);
  }
  void remove_file(const std::string& path) override {
    if (unlink(path.c_str()) != 0) io_fail("cannot remove", path);
  }
  void remove_folder(const std::string& path) override {
    if (rmdir(path.c_str()) != 0) io_fail("cannot remove folder", path);
  }
};

}  // namespace

CheckpointFiles& posix_checkpoint_files() {
  static PosixCheckpointFiles files;
  return files;
}

void atomic_write_file(CheckpointFiles& files, const std::string& path,
                       const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  files.write(tmp, bytes);
  files.sync_file(tmp);
  files.rename(tmp, path);
  files.sync_folder(dirname_of(path));
}

void atomic_write_file(const std::string& path, const std::string& bytes) {
  atomic_write_file(posix_checkpoint_files(), path, bytes);
}

bool path_exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

void remove_tree(CheckpointFiles& files, const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    files.remove_file(path);
    return;
  }
  std::vector<std::string> names;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) io_fail("cannot list", path);
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  for (const std::string& name : names) remove_tree(files, path + "/" + name);
  files.remove_folder(path);
}

std::string staging_folder(const std::string& dir, const std::string& tag) {
  return dir + "/." + tag + ".tmp";
}

std::string backup_folder(const std::string& dir, const std::string& tag) {
  return dir + "/." + tag + ".old";
}

std::string resolve_checkpoint_folder(const std::string& dir,
                                      const std::string& tag) {
  const std::string folder = dir + "/" + tag;
  if (path_exists(folder)) return folder;
  if (path_exists(backup_folder(dir, tag))) return backup_folder(dir, tag);
  if (path_exists(staging_folder(dir, tag))) return staging_folder(dir, tag);
  return folder;
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
  if (16 + header_len > in.size() - 8)
    throw corrupt("header runs past the end");
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

// Note [Manifest invariants]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The checksum finds any edit; these checks find a manifest whose values
// could not have been written by a save (a bug, or an edit that also
// recomputed the checksum), before anything is loaded:
//   counters, optimizer_steps, the loss scaler's iteration: >= 0;
//   skipped_steps + global_steps <= micro_steps (every step() that reaches
//     a boundary follows at least one backward());
//   global_steps <= global_samples (every applied update saw a sample);
//   optimizer_steps <= global_steps (a weights-only load restarts the
//     optimizer, so it may be behind, never ahead);
//   lr_schedule_iteration == global_steps - 1 (the schedule advances on
//     every applied update, from -1; engine/lr_schedule.h);
//   loss scale finite and > 0; hysteresis_left >= 1;
//   -1 <= last_overflow_iteration < iteration <= global_steps +
//     skipped_steps (the scaler counts boundary steps; it stands still
//     outside fp16, so it may be behind);
//   world_size >= 1, stage 0-3, numel == sum of param_numels, one file per
//   rank named rank_<r>.bin, dtype one of fp32, bf16, fp16.
std::string manifest_checksum(const std::string& manifest_json) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64,
                fnv1a64(manifest_json.data(), manifest_json.size()));
  return hex;
}

std::string encode_manifest(const Manifest& m) {
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["numel"] = m.numel;
  j["param_numels"] = m.param_numels;
  j["optimizer"] = m.optimizer;
  j["optimizer_steps"] = m.optimizer_steps;
  j["counters"] = {{"micro_steps", m.micro_steps},
                   {"global_steps", m.global_steps},
                   {"global_samples", m.global_samples},
                   {"skipped_steps", m.skipped_steps}};
  j["lr_schedule_iteration"] = m.lr_schedule_iteration;
  j["dtype"] = m.dtype;
  j["loss_scaler"] = {{"scale", m.loss_scale},
                      {"iteration", m.loss_scale_iteration},
                      {"last_overflow_iteration", m.last_overflow_iteration},
                      {"hysteresis_left", m.hysteresis_left}};
  nlohmann::json files = nlohmann::json::array();
  for (const Manifest::File& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"fnv1a", f.fnv1a}});
  j["files"] = files;
  j["manifest_fnv1a"] = manifest_checksum(j.dump());
  return j.dump(1) + "\n";
}

namespace {

// Reads one manifest field, failing with IoError(path, field, why).
class ManifestReader {
 public:
  explicit ManifestReader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& field,
                         const std::string& why) const {
    throw IoError("checkpoint manifest '" + path_ + "' is corrupt: field '" +
                  field + "' " + why +
                  ". Fix: load another checkpoint (nothing was changed)");
  }
  const nlohmann::json& at(const nlohmann::json& obj, const std::string& key,
                           const std::string& field) const {
    if (!obj.is_object() || !obj.contains(key)) fail(field, "is missing");
    return obj.at(key);
  }
  int64_t integer(const nlohmann::json& v, const std::string& field,
                  int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max()) const {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() >
             static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      fail(field, "= " + v.dump() + " is not a 64-bit integer");
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max)
      fail(field, "= " + std::to_string(x) + " is outside [" +
                      std::to_string(min) + ", " + std::to_string(max) + "]");
    return x;
  }
  uint64_t unsigned_integer(const nlohmann::json& v,
                            const std::string& field) const {
    if (!v.is_number_unsigned())
      fail(field, "= " + v.dump() + " is not a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string string(const nlohmann::json& v, const std::string& field) const {
    if (!v.is_string()) fail(field, "= " + v.dump() + " is not a string");
    return v.get<std::string>();
  }

 private:
  std::string path_;
};

}  // namespace

Manifest decode_manifest(const std::string& bytes, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    throw IoError("checkpoint manifest '" + path + "' is corrupt: " + e.what() +
                  ". Fix: load another checkpoint (nothing was "
                  "changed)");
  }
  const ManifestReader r(path);
  if (j.is_object() && j.contains("manifest_fnv1a")) {
    const std::string stored =
        r.string(r.at(j, "manifest_fnv1a", "manifest_fnv1a"), "manifest_fnv1a");
    j.erase("manifest_fnv1a");
    const std::string actual = manifest_checksum(j.dump());
    if (stored != actual)
      r.fail("manifest_fnv1a",
             "= " + stored + " does not match its content (" + actual +
                 "): the manifest was modified or damaged after it was "
                 "written");
    if (r.string(r.at(j, "format", "format"), "format") != kCheckpointFormat)
      r.fail("format", std::string("is not ") + kCheckpointFormat);
  } else if (r.string(r.at(j, "format", "format"), "format") ==
             kCheckpointFormatV1) {
    // Written before manifests carried their own checksum: every field is
    // still checked below, but an edit cannot be told from the original.
    log_message(LogLevel::kWarning,
                "checkpoint manifest '" + path + "' has format " +
                    kCheckpointFormatV1 +
                    " (no checksum of its own): its fields are range- and "
                    "consistency-checked, but an edited value cannot be "
                    "detected. Save the checkpoint again to protect it");
  } else {
    r.fail("manifest_fnv1a",
           std::string("is missing (a ") + kCheckpointFormat +
               " manifest carries the checksum of its content)");
  }
  Manifest m;
  m.world_size = static_cast<int>(
      r.integer(r.at(j, "world_size", "world_size"), "world_size", 1, 1 << 24));
  m.stage =
      static_cast<int>(r.integer(r.at(j, "stage", "stage"), "stage", 0, 3));
  m.numel = r.unsigned_integer(r.at(j, "numel", "numel"), "numel");
  const nlohmann::json& numels = r.at(j, "param_numels", "param_numels");
  if (!numels.is_array()) r.fail("param_numels", "is not an array");
  uint64_t sum = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    m.param_numels.push_back(r.unsigned_integer(
        numels[i], "param_numels[" + std::to_string(i) + "]"));
    sum += m.param_numels.back();
  }
  if (sum != m.numel)
    r.fail("numel", "= " + std::to_string(m.numel) +
                        " is not the sum of param_numels (" +
                        std::to_string(sum) + ")");
  m.optimizer = r.string(r.at(j, "optimizer", "optimizer"), "optimizer");
  m.optimizer_steps = r.integer(r.at(j, "optimizer_steps", "optimizer_steps"),
                                "optimizer_steps", 0);
  const nlohmann::json& c = r.at(j, "counters", "counters");
  auto counter = [&](const char* key) {
    const std::string field = std::string("counters.") + key;
    return r.integer(r.at(c, key, field), field, 0);
  };
  m.micro_steps = counter("micro_steps");
  m.global_steps = counter("global_steps");
  m.global_samples = counter("global_samples");
  m.skipped_steps = counter("skipped_steps");
  if (m.global_steps > m.micro_steps - m.skipped_steps)
    r.fail("counters.micro_steps",
           "= " + std::to_string(m.micro_steps) +
               " is below global_steps + skipped_steps (" +
               std::to_string(m.global_steps) + " + " +
               std::to_string(m.skipped_steps) + ")");
  if (m.global_samples < m.global_steps)
    r.fail("counters.global_samples", "= " + std::to_string(m.global_samples) +
                                          " is below global_steps (" +
                                          std::to_string(m.global_steps) + ")");
  if (m.optimizer_steps > m.global_steps)
    r.fail("optimizer_steps", "= " + std::to_string(m.optimizer_steps) +
                                  " is above global_steps (" +
                                  std::to_string(m.global_steps) + ")");
  m.lr_schedule_iteration =
      r.integer(r.at(j, "lr_schedule_iteration", "lr_schedule_iteration"),
                "lr_schedule_iteration", -1);
  if (m.lr_schedule_iteration != m.global_steps - 1)
    r.fail("lr_schedule_iteration",
           "= " + std::to_string(m.lr_schedule_iteration) +
               " is not global_steps - 1 (" +
               std::to_string(m.global_steps - 1) + ")");
  m.dtype = r.string(r.at(j, "dtype", "dtype"), "dtype");
  if (m.dtype != "fp32" && m.dtype != "bf16" && m.dtype != "fp16")
    r.fail("dtype", "= \"" + m.dtype + "\" is not fp32, bf16 or fp16");
  const nlohmann::json& ls = r.at(j, "loss_scaler", "loss_scaler");
  const nlohmann::json& scale = r.at(ls, "scale", "loss_scaler.scale");
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) ||
      scale.get<double>() <= 0)
    r.fail("loss_scaler.scale",
           "= " + scale.dump() + " is not a finite positive number");
  m.loss_scale = scale.get<double>();
  m.loss_scale_iteration =
      r.integer(r.at(ls, "iteration", "loss_scaler.iteration"),
                "loss_scaler.iteration", 0, m.global_steps + m.skipped_steps);
  m.last_overflow_iteration =
      r.integer(r.at(ls, "last_overflow_iteration",
                     "loss_scaler.last_overflow_iteration"),
                "loss_scaler.last_overflow_iteration", -1,
                std::max<int64_t>(-1, m.loss_scale_iteration - 1));
  m.hysteresis_left =
      r.integer(r.at(ls, "hysteresis_left", "loss_scaler.hysteresis_left"),
                "loss_scaler.hysteresis_left", 1);
  const nlohmann::json& files = r.at(j, "files", "files");
  if (!files.is_array() || files.size() != static_cast<size_t>(m.world_size))
    r.fail("files", "does not list one file per rank (world_size " +
                        std::to_string(m.world_size) + ")");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string at = "files[" + std::to_string(i) + "]";
    Manifest::File f;
    f.name = r.string(r.at(files[i], "name", at + ".name"), at + ".name");
    if (f.name != "rank_" + std::to_string(i) + ".bin")
      r.fail(at + ".name",
             "= \"" + f.name + "\" is not rank_" + std::to_string(i) + ".bin");
    f.bytes = r.unsigned_integer(r.at(files[i], "bytes", at + ".bytes"),
                                 at + ".bytes");
    f.fnv1a = r.unsigned_integer(r.at(files[i], "fnv1a", at + ".fnv1a"),
                                 at + ".fnv1a");
    m.files.push_back(f);
  }
  return m;
}

}  // namespace zerostep
