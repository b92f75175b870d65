// make_hf_model: writes a Hugging Face folder (config.json and
// model.safetensors, as transformers saves them) holding a randomly
// initialised decoder of one of the families zerostep implements
// (models/hf_decoder.h), for runs where no checkpoint can be downloaded:
// the harness (--model=hf:DIR), the benchmarks (both frameworks load the
// same folder), the GPU pack.
//
//   make_hf_model --out=DIR [--preset=tiny|20m|125m|350m] [--arch=llama|qwen2|qwen3]
//                 [--tied] [--seed=N] [--dtype=f32|bf16]
//                 [--vocab=N --hidden=N --intermediate=N --layers=N
//                  --heads=N --kv-heads=N --head-dim=N --max-positions=N]
//
// Presets (Llama 3's proportions, GQA 3:1, untied unless --tied):
//   tiny  vocab 256,   hidden 64,  intermediate 192,  2 layers, 4/2 heads  (0.1M)
//   20m   vocab 8192,  hidden 384, intermediate 1024, 8 layers, 6/2 heads  (18.9M)
//   125m  vocab 32000, hidden 768, intermediate 2048, 12 layers, 12/4 heads (125M)
//   350m  vocab 32000, hidden 1024, intermediate 2816, 24 layers, 16/4 heads (336M)
// Any shape flag replaces the preset's value. Weights: transformers'
// initialisation (N(0, 0.02), norms 1) from --seed (default 1).
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <string>

#include "common/cli.h"
#include "common/errors.h"
#include "models/hf_config.h"
#include "models/hf_decoder.h"

namespace zerostep {
namespace {

// The presets' shapes (the table in the header comment).
struct Preset {
  const char* name;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads;
};
constexpr Preset kPresets[] = {
    {"tiny", 256, 64, 192, 2, 4, 2},
    {"20m", 8192, 384, 1024, 8, 6, 2},
    {"125m", 32000, 768, 2048, 12, 12, 4},
    {"350m", 32000, 1024, 2816, 24, 16, 4},
};

HfDecoderConfig preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    HfDecoderConfig c = hf_config_for(HfArchitecture::kLlama);
    c.max_position_embeddings = 2048;
    c.rope_theta = 500000.0;
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.head_dim = p.hidden / p.heads;
    return c;
  }
  throw UsageError("make_hf_model: --preset=" + name +
                   ": not a preset. Fix: --preset=tiny, 20m, 125m or 350m");
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::cout << "usage: make_hf_model --out=DIR [--preset=tiny|20m|125m|350m] "
                   "[--arch=llama|qwen2|qwen3] [--tied] [--seed=N] "
                   "[--dtype=f32|bf16] [--vocab=N --hidden=N --intermediate=N "
                   "--layers=N --heads=N --kv-heads=N --head-dim=N "
                   "--max-positions=N]\n";
      return 0;
    }
    if (a == "--tied") {
      flags["tied"] = "1";
      continue;
    }
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos)
      throw UsageError("make_hf_model: '" + a +
                       "' is not --flag=value. Fix: see --help");
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  const auto take = [&](const std::string& key, const std::string& fallback) {
    const auto it = flags.find(key);
    if (it == flags.end()) return fallback;
    const std::string v = it->second;
    flags.erase(it);
    return v;
  };
  const std::string out = take("out", "");
  if (out.empty())
    throw UsageError("make_hf_model: --out=DIR is required (the folder to write)");
  HfDecoderConfig c = preset(take("preset", "tiny"));
  const std::string arch = take("arch", "llama");
  HfArchitecture a;
  if (arch == "llama")
    a = HfArchitecture::kLlama;
  else if (arch == "qwen2")
    a = HfArchitecture::kQwen2;
  else if (arch == "qwen3")
    a = HfArchitecture::kQwen3;
  else
    throw UsageError("make_hf_model: --arch=" + arch +
                     ": not one of llama, qwen2, qwen3");
  const HfDecoderConfig fixed = hf_config_for(a);
  c.architecture = a;
  c.qkv_bias = fixed.qkv_bias;
  c.o_bias = fixed.o_bias;
  c.qk_norm = fixed.qk_norm;
  c.tie_word_embeddings = take("tied", "0") == "1";
  const int64_t kMax = int64_t{1} << 20;
  for (const auto& [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab", &c.vocab_size},
           {"hidden", &c.hidden_size},
           {"intermediate", &c.intermediate_size},
           {"layers", &c.num_hidden_layers},
           {"heads", &c.num_attention_heads},
           {"kv-heads", &c.num_key_value_heads},
           {"head-dim", &c.head_dim},
           {"max-positions", &c.max_position_embeddings}}) {
    const std::string v = take(key, "");
    if (!v.empty()) *field = parse_int(std::string("--") + key, v, 1, kMax);
  }
  const std::string seed_text = take("seed", "1");
  const uint64_t seed = parse_uint64("--seed", seed_text);
  const std::string dtype = take("dtype", "f32");
  if (dtype != "f32" && dtype != "bf16")
    throw UsageError("make_hf_model: --dtype=" + dtype + ": not f32 or bf16");
  if (!flags.empty())
    throw UsageError("make_hf_model: unknown flag --" + flags.begin()->first +
                     ". Fix: see --help");
  if (const std::string why = hf_config_problem(c); !why.empty())
    throw UsageError("make_hf_model: " + why);
  HfCausalLm model = make_hf_decoder(c);
  init_hf_decoder_weights(*model, seed);
  save_hf_folder(*model, out, dtype == "f32" ? HfDtype::kF32 : HfDtype::kBF16);
  std::cout << "make_hf_model: wrote " << out << ": "
            << hf_architecture_name(a) << ", " << hf_parameter_count(c)
            << " parameters, " << dtype << ", seed " << seed << "\n";
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::run(argc, argv);
  } catch (const zerostep::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "make_hf_model: failed: "
              << zerostep::message_without_backtrace(e) << "\n";
    return 1;
  }
}
