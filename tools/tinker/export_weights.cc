#include "tools/tinker/export_weights.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "common/errors.h"
#include "engine/checkpoint_io.h"

namespace zerostep {
namespace tinker {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string peft_name(const std::string& name) {
  for (const auto& [ours, peft] :
       {std::pair<const char*, const char*>{"_lora.lora_a", ".lora_A.weight"},
        {"_lora.lora_b", ".lora_B.weight"}})
    if (ends_with(name, ours))
      return "base_model.model." +
             name.substr(0, name.size() - std::string(ours).size()) + peft;
  return "";
}

std::vector<std::string> peft_target_modules(const AdapterSpec& spec) {
  std::vector<std::string> out;
  if (spec.attn) out.insert(out.end(), {"qkv", "proj"});
  if (spec.mlp) out.insert(out.end(), {"fc", "fc_out"});
  if (spec.unembed) out.push_back("head");
  return out;
}

void write_peft_adapter(const SafetensorsFile& trainable,
                        const AdapterSpec& spec, const std::string& dir) {
  SafetensorsFile file;
  for (const SafetensorsTensor& t : trainable.tensors) {
    SafetensorsTensor renamed = t;
    renamed.name = peft_name(t.name);
    if (renamed.name.empty())
      throw UsageError("the trainable tensor '" + t.name +
                       "' is not a LoRA adapter's: a PEFT adapter holds "
                       "adapters only");
    file.tensors.push_back(std::move(renamed));
  }
  if (file.tensors.empty())
    throw UsageError("no LoRA adapter tensors to write as a PEFT adapter");
  file.metadata["format"] = "pt";
  nlohmann::ordered_json config;
  config["peft_type"] = "LORA";
  config["task_type"] = "CAUSAL_LM";
  config["base_model_name_or_path"] = spec.base_model;
  config["r"] = spec.rank;
  config["lora_alpha"] =
      spec.alpha > 0 ? spec.alpha : static_cast<double>(spec.rank);
  config["lora_dropout"] = 0.0;
  config["target_modules"] = peft_target_modules(spec);
  config["bias"] = "none";
  config["fan_in_fan_out"] = false;
  config["use_rslora"] = false;
  config["use_dora"] = false;
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  config["modules_to_save"] = nullptr;
  const std::string weights = dir + "/adapter_model.safetensors";
  atomic_write_file(weights, encode_safetensors(file, weights));
  atomic_write_file(dir + "/adapter_config.json", config.dump(2) + "\n");
}

void write_full_model(const SafetensorsFile& params,
                      const nlohmann::json& config, const std::string& dir) {
  SafetensorsFile file = params;
  file.metadata["format"] = "pt";
  const std::string weights = dir + "/model.safetensors";
  atomic_write_file(weights, encode_safetensors(file, weights));
  atomic_write_file(dir + "/config.json", config.dump(2) + "\n");
}

std::vector<std::string> external_weight_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "tinker_meta.json" || !it->is_regular_file(ec)) continue;
    out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tinker
}  // namespace zerostep
