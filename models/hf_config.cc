#include "models/hf_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM";

// Reads keys of one config object, collecting every problem.
class Reader {
 public:
  explicit Reader(const json& root) : root_(root) {}

  bool has(const char* key) const {
    return root_.contains(key) && !root_.at(key).is_null();
  }
  const json& at(const char* key) const { return root_.at(key); }

  void problem(const std::string& key, const std::string& value,
               const std::string& rule, const std::string& fix) {
    problems_.push_back({key, value, rule, fix});
  }

  // A positive integer; `fallback` when absent (0: required).
  int64_t positive_int(const char* key, int64_t fallback) {
    if (!has(key)) {
      if (fallback > 0) return fallback;
      problem(key, "", "is required (a positive integer)",
              "write the model's config.json as transformers saves it");
      return 1;
    }
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      problem(key, v.dump(), "must be a positive integer", "");
      return 1;
    }
    return v.get<int64_t>();
  }
  double number(const json& obj, const std::string& path, const char* key,
                double fallback, bool required = false) {
    if (!obj.contains(key) || obj.at(key).is_null()) {
      if (required)
        problem(path, "", "is required (a number)",
                "write the value the checkpoint was trained with");
      return fallback;
    }
    const json& v = obj.at(key);
    if (!v.is_number()) {
      problem(path, v.dump(), "must be a number", "");
      return fallback;
    }
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) {
      problem(key, at(key).dump(), "must be true or false", "");
      return fallback;
    }
    return at(key).get<bool>();
  }
  size_t count() const { return problems_.size(); }
  std::vector<ConfigProblem> take() { return std::move(problems_); }

 private:
  const json& root_;
  std::vector<ConfigProblem> problems_;
};

}  // namespace

const char* hf_architecture_name(HfArchitecture a) {
  switch (a) {
    case HfArchitecture::kLlama:
      return "LlamaForCausalLM";
    case HfArchitecture::kQwen2:
      return "Qwen2ForCausalLM";
    case HfArchitecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "?";
}

HfDecoderConfig parse_hf_config(const std::string& text,
                                const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError({{"(file)", "", std::string("is not valid JSON: ") + e.what(),
                        "write the config.json that transformers saved"}},
                      source, "model config");
  }
  if (!root.is_object())
    throw ConfigError({{"(file)", elide(root.dump(), 80), "must be a JSON object",
                        "write the config.json that transformers saved"}},
                      source, "model config");
  Reader r(root);
  HfDecoderConfig c;

  // The architecture, and model_type agreeing with it.
  const char* model_type = "llama";
  if (!r.has("architectures")) {
    r.problem("architectures", "",
              std::string("is required: one of ") + kSupported,
              "write the architecture the checkpoint was saved from");
  } else {
    const json& a = r.at("architectures");
    const std::string name =
        a.is_array() && a.size() == 1 && a[0].is_string() ? a[0].get<std::string>()
                                                          : "";
    if (name == "LlamaForCausalLM") {
      c.architecture = HfArchitecture::kLlama;
    } else if (name == "Qwen2ForCausalLM") {
      c.architecture = HfArchitecture::kQwen2;
      model_type = "qwen2";
    } else if (name == "Qwen3ForCausalLM") {
      c.architecture = HfArchitecture::kQwen3;
      model_type = "qwen3";
    } else {
      r.problem("architectures", a.dump(),
                std::string("must name one architecture zerostep implements: ") +
                    kSupported,
                "use a checkpoint of one of these families (MoE, vision and "
                "other decoders are not implemented)");
    }
  }
  if (r.has("model_type") &&
      (!r.at("model_type").is_string() ||
       r.at("model_type").get<std::string>() != model_type))
    r.problem("model_type", r.at("model_type").dump(),
              std::string("must be \"") + model_type + "\" for " +
                  hf_architecture_name(c.architecture),
              "a config whose model_type and architectures disagree is not "
              "one transformers wrote");
  const bool llama = c.architecture == HfArchitecture::kLlama;
  const bool qwen3 = c.architecture == HfArchitecture::kQwen3;

  // Shapes; defaults as transformers' config classes.
  const size_t problems_before_shapes = r.count();
  c.vocab_size = r.positive_int("vocab_size", 0);
  c.hidden_size = r.positive_int("hidden_size", 0);
  c.intermediate_size = r.positive_int("intermediate_size", 0);
  c.num_hidden_layers = r.positive_int("num_hidden_layers", 0);
  c.num_attention_heads = r.positive_int("num_attention_heads", 0);
  c.num_key_value_heads = r.positive_int(
      "num_key_value_heads", llama ? c.num_attention_heads : 32);
  // Llama and Qwen2 derive head_dim; Qwen3's class default is 128.
  c.head_dim = r.positive_int(
      "head_dim", qwen3 ? 128
                        : std::max<int64_t>(1, c.hidden_size /
                                                   c.num_attention_heads));
  c.max_position_embeddings =
      r.positive_int("max_position_embeddings", llama ? 2048 : 32768);
  // The rules between shapes, when each shape is one (no derived noise).
  const bool shapes_ok = r.count() == problems_before_shapes;
  if (shapes_ok && llama && c.hidden_size % c.num_attention_heads != 0)
    r.problem("num_attention_heads", std::to_string(c.num_attention_heads),
              "must divide hidden_size = " + std::to_string(c.hidden_size) +
                  " (transformers' LlamaConfig refuses it too)",
              "");
  if (shapes_ok && c.num_attention_heads % c.num_key_value_heads != 0)
    r.problem("num_key_value_heads", std::to_string(c.num_key_value_heads),
              "must divide num_attention_heads = " +
                  std::to_string(c.num_attention_heads) +
                  " (each key/value head serves a whole group of query heads)",
              "");
  if (shapes_ok && c.head_dim % 2 != 0)
    r.problem("head_dim", std::to_string(c.head_dim),
              "must be even (RoPE rotates pairs of dimensions)", "");

  c.rms_norm_eps = r.number(root, "rms_norm_eps", "rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0))
    r.problem("rms_norm_eps", std::to_string(c.rms_norm_eps),
              "must be positive", "");
  c.initializer_range =
      r.number(root, "initializer_range", "initializer_range", 0.02);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);

  // Biases and norms by architecture (transformers 5.24's modules).
  if (c.architecture == HfArchitecture::kQwen2) {
    c.qkv_bias = true;  // always, whatever attention_bias says
  } else {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  }
  if (llama) c.mlp_bias = r.boolean("mlp_bias", false);
  c.qk_norm = qwen3;

  if (r.has("hidden_act") && (!r.at("hidden_act").is_string() ||
                              r.at("hidden_act").get<std::string>() != "silu"))
    r.problem("hidden_act", r.at("hidden_act").dump(),
              "must be \"silu\" (the SwiGLU MLP these families use)",
              "use a checkpoint with hidden_act silu");
  if (r.has("attention_dropout") &&
      (!r.at("attention_dropout").is_number() ||
       r.at("attention_dropout").get<double>() != 0.0))
    r.problem("attention_dropout", r.at("attention_dropout").dump(),
              "must be 0: attention dropout is not implemented, and "
              "transformers applies it in training",
              "set \"attention_dropout\": 0.0");
  if (r.has("quantization_config"))
    r.problem("quantization_config", elide(r.at("quantization_config").dump(), 80),
              "is not supported: zerostep trains float32 master weights",
              "use the unquantized checkpoint");

  // RoPE: transformers takes "rope_scaling" (older files) over
  // "rope_parameters"; theta from either, else the top level, else 10000.
  json rope = json::object();
  std::string rope_key = "rope_parameters";
  if (r.has("rope_scaling") && !r.at("rope_scaling").empty()) {
    rope = r.at("rope_scaling");
    rope_key = "rope_scaling";
  } else if (r.has("rope_parameters")) {
    rope = r.at("rope_parameters");
  }
  if (!rope.is_object()) {
    r.problem(rope_key, rope.dump(), "must be an object", "");
    rope = json::object();
  }
  for (const char* layer_type : {"full_attention", "sliding_attention"})
    if (rope.contains(layer_type))
      r.problem(rope_key + "." + layer_type, elide(rope[layer_type].dump(), 80),
                "RoPE parameters per layer type are not supported",
                "one RoPE for every layer");
  c.rope_theta = r.number(rope, rope_key + ".rope_theta", "rope_theta",
                          r.number(root, "rope_theta", "rope_theta", 10000.0));
  if (!(c.rope_theta > 0))
    r.problem(rope_key + ".rope_theta", std::to_string(c.rope_theta),
              "must be positive", "");
  std::string rope_type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rope.contains(key)) {
      rope_type = rope[key].is_string() ? rope[key].get<std::string>()
                                        : rope[key].dump();
      break;
    }
  if (rope_type == "llama3") {
    c.llama3_rope = true;
    const std::string p = rope_key + ".";
    c.rope_factor = r.number(rope, p + "factor", "factor", 1.0, true);
    c.rope_low_freq_factor =
        r.number(rope, p + "low_freq_factor", "low_freq_factor", 1.0, true);
    c.rope_high_freq_factor =
        r.number(rope, p + "high_freq_factor", "high_freq_factor", 2.0, true);
    if (c.rope_low_freq_factor == c.rope_high_freq_factor)
      r.problem(p + "high_freq_factor", std::to_string(c.rope_high_freq_factor),
                "must differ from low_freq_factor (llama3 RoPE divides by "
                "their difference)",
                "");
    // A top-level original_max_position_embeddings wins (transformers'
    // standardize_rope_params).
    const bool top = r.has("original_max_position_embeddings");
    const json& holder = top ? root : rope;
    const std::string where = top ? "original_max_position_embeddings"
                                  : p + "original_max_position_embeddings";
    if (holder.contains("original_max_position_embeddings") &&
        !holder["original_max_position_embeddings"].is_null()) {
      const json& v = holder["original_max_position_embeddings"];
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        r.problem(where, v.dump(), "must be a positive integer", "");
      else
        c.rope_original_max_position_embeddings = v.get<int64_t>();
    } else {
      c.rope_original_max_position_embeddings = c.max_position_embeddings;
    }
  } else if (rope_type != "default") {
    r.problem(rope_key + ".rope_type", "\"" + rope_type + "\"",
              "is not supported: the RoPE types implemented are \"default\" "
              "and \"llama3\"",
              "use a checkpoint with one of them (linear, dynamic, yarn, "
              "longrope, ... would change the numbers if ignored)");
  }
  for (const json* holder : {&rope, &root})
    if (holder->contains("partial_rotary_factor") &&
        !(*holder)["partial_rotary_factor"].is_null() &&
        (!(*holder)["partial_rotary_factor"].is_number() ||
         (*holder)["partial_rotary_factor"].get<double>() != 1.0))
      r.problem(holder == &rope ? rope_key + ".partial_rotary_factor"
                                : "partial_rotary_factor",
                (*holder)["partial_rotary_factor"].dump(),
                "must be 1: partial rotary embeddings are not implemented",
                "");

  // Sliding windows (Qwen2, Qwen3): transformers' layer_types rule.
  if (!llama) {
    const bool sliding = r.boolean("use_sliding_window", false);
    const int64_t max_window_layers =
        r.has("max_window_layers") && r.at("max_window_layers").is_number_integer()
            ? r.at("max_window_layers").get<int64_t>()
            : 28;
    if (r.has("layer_types")) {
      const json& types = r.at("layer_types");
      bool ok = types.is_array();
      if (ok)
        for (const json& t : types)
          ok = ok && t.is_string() && t.get<std::string>() == "full_attention";
      if (!ok)
        r.problem("layer_types", elide(types.dump(), 120),
                  "every layer must be \"full_attention\": sliding-window "
                  "attention is not implemented",
                  "use a checkpoint without sliding windows");
    } else if (sliding &&
               !(root.contains("sliding_window") &&
                 root["sliding_window"].is_null()) &&
               max_window_layers < c.num_hidden_layers) {
      r.problem("use_sliding_window", "true",
                "sliding-window attention (layers " +
                    std::to_string(max_window_layers) + " and above, from "
                    "max_window_layers) is not implemented",
                "set \"use_sliding_window\": false if the checkpoint was "
                "trained without it");
    }
  }

  for (const char* key : {"dtype", "torch_dtype"})
    if (r.has(key) && r.at(key).is_string()) {
      c.dtype = r.at(key).get<std::string>();
      break;
    }
  std::vector<ConfigProblem> problems = r.take();
  if (!problems.empty())
    throw ConfigError(std::move(problems), source, "model config");
  return c;
}

HfDecoderConfig hf_config_for(HfArchitecture a) {
  HfDecoderConfig c;
  c.architecture = a;
  c.qkv_bias = a == HfArchitecture::kQwen2;
  c.qk_norm = a == HfArchitecture::kQwen3;
  return c;
}

std::string hf_config_problem(const HfDecoderConfig& c) {
  const std::string arch = hf_architecture_name(c.architecture);
  const bool qwen2 = c.architecture == HfArchitecture::kQwen2;
  const bool qwen3 = c.architecture == HfArchitecture::kQwen3;
  if (c.qk_norm != qwen3)
    return "qk_norm = " + std::string(c.qk_norm ? "true" : "false") +
           ": " + arch + (qwen3 ? " has" : " has no") +
           " per-head q/k norms. Fix: start from hf_config_for()";
  if (qwen2 && (!c.qkv_bias || c.o_bias || c.mlp_bias))
    return arch + " has q/k/v biases and no others. Fix: start from "
                  "hf_config_for()";
  if (!qwen2 && c.qkv_bias != c.o_bias)
    return arch + "'s attention_bias gives q, k, v and o biases together "
                  "(qkv_bias = o_bias)";
  if (qwen3 && c.mlp_bias) return arch + " has no MLP biases";
  for (const auto& [name, v] :
       {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads},
        {"num_key_value_heads", c.num_key_value_heads},
        {"head_dim", c.head_dim},
        {"max_position_embeddings", c.max_position_embeddings}})
    if (v < 1) return std::string(name) + " = " + std::to_string(v) + " must be positive";
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return "num_key_value_heads = " + std::to_string(c.num_key_value_heads) +
           " must divide num_attention_heads = " +
           std::to_string(c.num_attention_heads);
  if (c.head_dim % 2 != 0)
    return "head_dim = " + std::to_string(c.head_dim) + " must be even";
  return "";
}

HfDecoderConfig read_hf_config(const std::string& dir) {
  const std::string path =
      dir.empty() || dir.back() == '/' ? dir + "config.json" : dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError("cannot read '" + path +
                  "' (a Hugging Face model folder holds config.json beside "
                  "its safetensors)");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_hf_config(text.str(), path);
}

std::string hf_config_json(const HfDecoderConfig& c) {
  json j;
  j["architectures"] = {hf_architecture_name(c.architecture)};
  j["model_type"] = c.architecture == HfArchitecture::kLlama   ? "llama"
                    : c.architecture == HfArchitecture::kQwen2 ? "qwen2"
                                                               : "qwen3";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  if (c.architecture != HfArchitecture::kQwen2)
    j["attention_bias"] = c.qkv_bias;
  if (c.architecture == HfArchitecture::kLlama) j["mlp_bias"] = c.mlp_bias;
  if (c.architecture != HfArchitecture::kLlama) j["use_sliding_window"] = false;
  json rope = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
  if (c.llama3_rope) {
    rope["rope_type"] = "llama3";
    rope["factor"] = c.rope_factor;
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    rope["original_max_position_embeddings"] =
        c.rope_original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  j["dtype"] = c.dtype.empty() ? "float32" : c.dtype;
  return j.dump(2) + "\n";
}

int64_t hf_parameter_count(const HfDecoderConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim,
                ff = c.intermediate_size;
  int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * ff + 2 * h;
  if (c.qkv_bias) layer += q + 2 * kv;
  if (c.o_bias) layer += h;
  if (c.mlp_bias) layer += 2 * ff + h;
  if (c.qk_norm) layer += 2 * c.head_dim;
  int64_t total = c.num_hidden_layers * layer + c.vocab_size * h + h;
  if (!c.tie_word_embeddings) total += c.vocab_size * h;
  return total;
}

}  // namespace zerostep
