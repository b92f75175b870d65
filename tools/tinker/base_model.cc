#include "tools/tinker/base_model.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "models/hf_config.h"

namespace zerostep {
namespace tinker {
namespace {

std::vector<BaseModel>& served() {
  static std::vector<BaseModel> models = {
      {"zerostep/tiny-gpt", 256, 64, 32, 2, 2},
      {"zerostep/small-gpt", 256, 128, 64, 4, 4},
  };
  return models;
}

// eos_token_id of the JSON file `path` (absent file or key: nothing).
void add_eos_ids(const std::string& path, std::set<int64_t>* ids) {
  std::ifstream in(path);
  if (!in) return;
  std::stringstream s;
  s << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(s.str());
  } catch (const std::exception& e) {
    throw UsageError("'" + path + "' is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("eos_token_id") ||
      j["eos_token_id"].is_null())
    return;
  const nlohmann::json& e = j["eos_token_id"];
  const std::string rule = "'" + path +
                           "': eos_token_id must be a token id or a list of "
                           "token ids; it is " +
                           e.dump();
  if (e.is_number_integer()) {
    ids->insert(e.get<int64_t>());
    return;
  }
  if (!e.is_array()) throw UsageError(rule);
  for (const nlohmann::json& v : e) {
    if (!v.is_number_integer()) throw UsageError(rule);
    ids->insert(v.get<int64_t>());
  }
}

}  // namespace

const std::vector<BaseModel>& base_models() { return served(); }

const BaseModel& find_base_model(const std::string& name) {
  std::string names;
  for (const BaseModel& b : base_models()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  throw UsageError("unknown base_model '" + name +
                   "'. This server has: " + names);
}

BaseModel hf_base_model(const std::string& name, const std::string& dir) {
  HfDecoderConfig c;
  try {
    c = read_hf_config(dir);
  } catch (const std::exception& e) {
    throw UsageError("--model=" + name + "=" + dir +
                     ": the folder cannot be served: " + e.what());
  }
  BaseModel b;
  b.name = name;
  b.hf_dir = std::filesystem::absolute(dir).lexically_normal().string();
  if (b.hf_dir.size() > 1 && b.hf_dir.back() == '/') b.hf_dir.pop_back();
  b.arch = hf_architecture_name(c.architecture);
  b.vocab_size = c.vocab_size;
  b.max_context = c.max_position_embeddings;
  b.d_model = c.hidden_size;
  b.n_head = c.num_attention_heads;
  b.n_layer = c.num_hidden_layers;
  std::set<int64_t> eos;
  add_eos_ids(dir + "/config.json", &eos);
  add_eos_ids(dir + "/generation_config.json", &eos);
  for (int64_t id : eos)
    if (id < 0 || id >= c.vocab_size)
      throw UsageError("--model=" + name + "=" + dir + ": eos_token_id " +
                       std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(c.vocab_size) + ")");
  b.eos_token_ids.assign(eos.begin(), eos.end());
  return b;
}

std::pair<std::string, std::string> split_model_flag(const std::string& v) {
  const size_t eq = v.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
    throw UsageError("--model='" + v +
                     "' must be NAME=DIR: the name clients pass as "
                     "base_model, then the Hugging Face folder (e.g. "
                     "--model=Qwen/Qwen3-0.6B=/models/qwen3-0.6b)");
  return {v.substr(0, eq), v.substr(eq + 1)};
}

void serve_hf_base_models(const std::vector<BaseModel>& models) {
  std::set<std::string> names;
  for (const BaseModel& b : served()) names.insert(b.name);
  for (const BaseModel& b : models)
    if (!names.insert(b.name).second)
      throw UsageError("--model: the name '" + b.name +
                       "' is served twice. Fix: give each folder its own "
                       "NAME");
  served().insert(served().end(), models.begin(), models.end());
}

}  // namespace tinker
}  // namespace zerostep
