#include "tools/tinker/tenancy.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "common/errors.h"
#include "tools/tinker/checkpoint_paths.h"

namespace zerostep {
namespace tinker {

std::string tenant_name_problem(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return "a tenant name has 1 to 64 characters";
  if (!std::isalnum(static_cast<unsigned char>(name[0])))
    return "a tenant name starts with a letter or a digit";
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
          c == '_' || c == '.'))
      return "a tenant name is made of letters, digits, '.', '_' and '-'";
  if (name.rfind("tml-", 0) == 0)
    return "a tenant name does not start with 'tml-' (an API key's prefix: "
           "is the key in the tenant's place?)";
  if (name.rfind("key-", 0) == 0)
    return "a tenant name does not start with 'key-' (the names of keys "
           "without a tenant)";
  return "";
}

std::string tenant_dir(const std::string& state_dir,
                       const std::string& tenant) {
  return state_dir + "/tenants/" + tenant;
}

std::string run_dir(const std::string& state_dir, const std::string& tenant,
                    const std::string& model_id) {
  return tenant_dir(state_dir, tenant) + "/" + model_folder(model_id);
}

std::optional<CheckpointLocation> locate_checkpoint(
    const std::string& state_dir, const std::string& tenant,
    const std::string& path, const std::string& kind) {
  CheckpointLocation at;
  if (!parse_tinker_path_of_kind(path, kind, &at.model_id, &at.name))
    return std::nullopt;
  at.run = run_dir(state_dir, tenant, at.model_id);
  at.dir = kind == "weights" ? at.run + "/" + at.name
                             : at.run + "/" + kind + "/" + at.name;
  return at;
}

namespace {

// "50000 bytes", or "123456789 bytes (117.7 MiB)", for a message.
std::string show_bytes(uint64_t n) {
  std::string out = std::to_string(n) + " bytes";
  if (n < (1 << 20)) return out;
  char buf[32];
  std::snprintf(buf, sizeof(buf), " (%.1f MiB)",
                static_cast<double>(n) / (1 << 20));
  return out + buf;
}

}  // namespace

std::string over_bytes_quota(const Caller& caller, const std::string& what,
                             uint64_t held, uint64_t needed) {
  if (!caller.max_bytes || held + needed <= *caller.max_bytes) return "";
  return what + ": tenant '" + caller.tenant + "' holds " + show_bytes(held) +
         " in the state directory and this needs up to " +
         show_bytes(needed) + " more, over its quota of " +
         show_bytes(*caller.max_bytes) +
         " (max_bytes in the server's --api-keys file, or "
         "--tenant-max-bytes). Nothing was written. Fix: delete checkpoints "
         "you no longer need (RestClient.delete_checkpoint_from_tinker_path) "
         "or ask the server's operator for a larger quota";
}

uint64_t tree_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  uint64_t total = 0;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (it->is_regular_file(e) && !it->is_symlink(e)) {
      const uintmax_t n = it->file_size(e);
      if (!e) total += n;
    }
  }
  return total;
}

std::vector<std::string> pre_tenant_run_folders(const std::string& state_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(state_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e;
    if (it->is_directory(e) &&
        (name.rfind("session-", 0) == 0 || name.rfind("model-", 0) == 0))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string unknown_sampling_session(const std::string& id) {
  return "unknown sampling_session_id '" + elide(id, 200) +
         "'. Fix: create a sampling client first "
         "(save_weights_and_get_sampling_client or create_sampling_client)";
}

bool TenantIds::claim(const std::string& id, const std::string& tenant) {
  return owner_.emplace(id, tenant).second;
}

bool TenantIds::owns(const std::string& tenant, const std::string& id) const {
  auto it = owner_.find(id);
  return it != owner_.end() && it->second == tenant;
}

bool TenantIds::taken(const std::string& id) const {
  return owner_.count(id) != 0;
}

std::vector<std::string> TenantIds::ids_of(const std::string& tenant) const {
  std::vector<std::string> out;
  for (const auto& kv : owner_)
    if (kv.second == tenant) out.push_back(kv.first);
  return out;
}

}  // namespace tinker
}  // namespace zerostep
