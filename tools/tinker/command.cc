#include "tools/tinker/command.h"

#include <cstring>
#include <vector>

#include "common/errors.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {

CommandResult CommandResult::failure(std::string error, std::string category) {
  CommandResult r;
  r.ok = false;
  r.error = std::move(error);
  r.category = std::move(category);
  return r;
}

// Layout: 8-byte little-endian length of the JSON header, the header
// {"op", "args", "tenant", "max_models", "max_bytes"} (a quota null when
// unlimited), then the blob.
std::string encode_command(const Command& c) {
  nlohmann::json h = {{"op", c.op},
                      {"args", c.args},
                      {"tenant", c.caller.tenant},
                      {"max_models", nullptr},
                      {"max_bytes", nullptr}};
  if (c.caller.max_models) h["max_models"] = *c.caller.max_models;
  if (c.caller.max_bytes) h["max_bytes"] = *c.caller.max_bytes;
  const std::string header = h.dump();
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out += c.blob;
  return out;
}

Command decode_command(const std::string& bytes) {
  if (bytes.size() < 8) throw UsageError("command: truncated header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) throw UsageError("command: truncated header");
  Command c;
  try {
    nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
    c.op = h.at("op").get<std::string>();
    c.args = h.at("args");
    c.caller.tenant = h.at("tenant").get<std::string>();
    if (!h.at("max_models").is_null())
      c.caller.max_models = h["max_models"].get<int64_t>();
    if (!h.at("max_bytes").is_null())
      c.caller.max_bytes = h["max_bytes"].get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("command: bad header: ") + e.what());
  }
  c.blob = bytes.substr(8 + n);
  return c;
}

void broadcast_bytes(Communicator& comm, std::string* bytes) {
  int64_t size = static_cast<int64_t>(bytes->size());
  comm.broadcast(Buffer::of(&size, 1), {0, phase::kSetup});
  std::vector<int64_t> words(static_cast<size_t>((size + 7) / 8), 0);
  if (comm.rank() == 0 && size > 0) std::memcpy(words.data(), bytes->data(), bytes->size());
  if (!words.empty())
    comm.broadcast(Buffer::of(words.data(), words.size()), {0, phase::kSetup});
  if (comm.rank() != 0) {
    bytes->assign(reinterpret_cast<const char*>(words.data()),
                  static_cast<size_t>(size));
  }
}

}  // namespace tinker
}  // namespace zerostep
