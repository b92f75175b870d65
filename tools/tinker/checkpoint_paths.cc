#include "tools/tinker/checkpoint_paths.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace zerostep {
namespace tinker {

bool safe_checkpoint_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s == "latest" || s == "." || s == "..")
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
          c == '.'))
      return false;
  return true;
}

std::string model_folder(const std::string& model_id) {
  std::string f = model_id;
  for (char& c : f)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.'))
      c = '_';
  return f;
}

std::string default_state_dir() {
  const char* xdg = std::getenv("XDG_STATE_HOME");
  if (xdg != nullptr && xdg[0] == '/')
    return std::string(xdg) + "/zerostep/trainer_server";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/')
    return std::string(home) + "/.local/state/zerostep/trainer_server";
  return "/tmp/zerostep-trainer_server-" + std::to_string(getuid());
}

bool parse_tinker_path(const std::string& path, std::string* model_id,
                       std::string* name) {
  return parse_tinker_path_of_kind(path, "weights", model_id, name);
}

bool parse_sampler_path(const std::string& path, std::string* model_id,
                        std::string* name) {
  return parse_tinker_path_of_kind(path, "sampler_weights", model_id, name);
}

bool parse_tinker_path_of_kind(const std::string& path, const std::string& kind,
                               std::string* model_id, std::string* name) {
  const std::string prefix = "tinker://";
  if (path.rfind(prefix, 0) != 0) return false;
  std::vector<std::string> parts;
  const std::string rest = path.substr(prefix.size());
  size_t at = 0;
  while (true) {
    const size_t slash = rest.find('/', at);
    parts.push_back(rest.substr(at, slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  if (parts.size() != 3 || parts[1] != kind) return false;
  if (model_folder(parts[0]).find_first_not_of('.') == std::string::npos)
    return false;  // empty, ".", "..", ...
  if (!safe_checkpoint_name(parts[2])) return false;
  *model_id = parts[0];
  *name = parts[2];
  return true;
}

bool within_dir(const std::string& root, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(root, ec);
  if (ec) return false;
  const fs::path p = fs::weakly_canonical(path, ec);
  if (ec) return false;
  auto ri = r.begin(), pi = p.begin();
  for (; ri != r.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // a trailing separator
    if (pi == p.end() || *ri != *pi) return false;
  }
  return true;
}

std::string scrub_path(std::string message, const std::string& dir,
                       const std::string& label) {
  if (dir.empty()) return message;
  for (size_t at = message.find(dir); at != std::string::npos;
       at = message.find(dir, at + label.size()))
    message.replace(at, dir.size(), label);
  return message;
}

}  // namespace tinker
}  // namespace zerostep
