// zerostep's side of models/hf_parity_test.sh:
//
//   hf_parity_check OUT
//
// 1. For every case hf_parity.py made (OUT/cases.json): loads the folder,
//    runs the same tokens forward and one backward of the mean
//    cross-entropy, and compares the logits and every parameter's gradient
//    with transformers' (OUT/ref/<case>.safetensors).
// 2. Writes the exports hf_parity.py check_exports reads back, with the
//    logits they must give (OUT/exports/): LoRA adapters of an untied and
//    a tied Llama (every projection and lm_head) trained at ZeRO stage 3
//    on two simulated ranks, written in PEFT's format; a full model
//    fine-tuned at stage 3, written by Engine::export_full_model beside the
//    base's config.json; and a folder save_hf_folder wrote from a model
//    built here.
// Prints one line per comparison; exits 1 if any fails.
//
// Note [Parity tolerances]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// float32: every logit and every gradient element within 1e-5 (absolute)
// of transformers'. On Debian's LibTorch 1.13 the models compute the same
// operations in the same order through other kernels (OpenBLAS against
// torch 2.11's, eager attention against transformers' default sdpa), so
// the bits differ by summation order: the measured maxima are printed. On
// LibTorch 2 (--config=cuda, transformers' own torch) attention is the
// same fused kernel (Note [Fused causal attention] in hf_decoder.cc) and
// the logits must be bitwise equal; gradients keep the 1e-5 bound (Qwen3's
// q/k norm weights sum their gradient in another order: 5.6e-9).
//
// Note [bf16 parity tolerance]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// bf16 has 8 bits of mantissa: two correct bf16 implementations differ by
// rounding at every operation, by as much as each differs from the exact
// result, so a fixed absolute bound says little. The reference is
// transformers' float32 run on the same (bf16-valued) weights; the
// yardstick is transformers' own bf16 run with its eager attention, the
// algorithm the decoders here implement (unfused: scores, softmax in
// float32 rounded to bf16, product). The rule: zerostep's bf16 result is no
// further from the reference than transformers' eager bf16 result is, with
// a factor 2 of room for rounding that falls the other way:
//   max |zs_bf16 - ref_fp32| <= 2 * max |hf_eager_bf16 - ref_fp32|
// for the logits and for each parameter's gradient (the whole tensor's
// maximum). Not transformers' default sdpa attention: it fuses attention
// and rounds once, and its bf16 error differs from eager's by up to 2.13x
// on these models (a k_proj bias of Qwen2), more than the factor allows.
// Measured (the lines also print the sdpa ratio and the largest
// |zs_bf16 - hf_eager_bf16|): on LibTorch 2.11 (--config=cuda, the torch
// transformers runs on) zerostep's bf16 logits and every gradient equal
// transformers' eager ones bit for bit (ratio 1, difference 0); on
// Debian's LibTorch 1.13 the worst gradient ratio is 1.26 / 1.58 / 1.50
// (Llama / Qwen2 / Qwen3), logits 0.94-1.04. What it catches: bf16
// products that accumulate in bf16 (LibTorch 1.13's CPU kernels, with
// Note [bf16 products on LibTorch 1.13's CPU] in hf_decoder.cc planted
// back) give 2.45 / 2.90 / 3.25 and fail every case. What it cannot see
// at these widths: an RMSNorm computed in bf16 instead of float32 stayed
// at 1.97x of the sdpa yardstick (the mean of 64 squares loses little in
// bf16); such a bug is within bf16's own noise until the hidden size is
// large.
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/local_world.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/hf_checkpoint.h"
#include "engine/safetensors.h"
#include "models/hf_decoder.h"
#include "models/lora.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

// A safetensors file's tensors (F32 or I64) as LibTorch tensors, by name.
std::map<std::string, torch::Tensor> read_tensors(const std::string& path) {
  const SafetensorsFile f = read_safetensors_file(path);
  std::map<std::string, torch::Tensor> out;
  for (const SafetensorsTensor& t : f.tensors) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    const auto dtype = t.dtype == "I64" ? torch::kLong : torch::kFloat;
    ZS_CHECK(t.dtype == "I64" || t.dtype == "F32");
    torch::Tensor v = torch::empty(shape, dtype);
    std::memcpy(v.data_ptr(), t.data.data(), t.data.size());
    out[t.name] = v;
  }
  return out;
}

void write_tensors(const std::string& path,
                   const std::map<std::string, torch::Tensor>& tensors) {
  SafetensorsFile f;
  for (const auto& [name, value] : tensors) {
    torch::Tensor v = value.contiguous();
    SafetensorsTensor t;
    t.name = name;
    t.dtype = v.scalar_type() == torch::kLong ? "I64" : "F32";
    for (int64_t d : v.sizes()) t.shape.push_back(static_cast<uint64_t>(d));
    t.data.assign(static_cast<const char*>(v.data_ptr()),
                  static_cast<size_t>(v.numel() * v.element_size()));
    f.tensors.push_back(std::move(t));
  }
  std::ofstream(path, std::ios::binary) << encode_safetensors(f, path);
}

double max_abs(const torch::Tensor& a) {
  return a.abs().max().item<double>();
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  const torch::Tensor l = logits.to(torch::kFloat);
  return torch::nn::functional::cross_entropy(l.reshape({-1, l.size(-1)}),
                                              targets.reshape({-1}));
}

bool report(bool ok, const std::string& line) {
  std::cout << (ok ? "ok   " : "FAIL ") << line << std::endl;
  return ok;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// One case: load, forward, backward, compare.
bool check_case(const std::string& out, const nlohmann::json& c) {
  const std::string name = c["name"];
  const bool bf16 = c["dtype"] == "bfloat16";
  HfCausalLm model = load_hf_decoder(out + "/" + name);
  if (bf16) model->to(torch::kBFloat16);
  auto ref = read_tensors(out + "/ref/" + name + ".safetensors");
  const torch::Tensor logits = model->forward(ref["tokens"]);
  loss_of(logits, ref["targets"]).backward();
  bool ok = true;
  const std::string arch = hf_architecture_name(model->config().architecture);
  // bf16: transformers' sdpa ratio on the worst tensor, and zerostep's
  // largest difference from transformers' eager result.
  double sdpa_ratio = 0, worst_ratio = 0, diff_to_eager = 0;
  const auto compare = [&](const torch::Tensor& ours, const std::string& key) {
    const torch::Tensor mine = ours.to(torch::kFloat);
    const double diff = max_abs(mine - ref.at(key));
    if (!bf16) return std::make_pair(diff <= 1e-5, diff);
    // Note [bf16 parity tolerance].
    const torch::Tensor& exact = ref.at("fp32." + key);
    const double ours_err = max_abs(mine - exact);
    const double eager_err = max_abs(ref.at("eager." + key) - exact);
    const double ratio = ours_err / std::max(eager_err, 1e-30);
    if (ratio >= worst_ratio) {
      worst_ratio = ratio;
      sdpa_ratio = max_abs(ref.at(key) - exact) / std::max(eager_err, 1e-30);
    }
    diff_to_eager = std::max(diff_to_eager, max_abs(mine - ref.at("eager." + key)));
    return std::make_pair(ours_err <= 2 * eager_err, ratio);
  };
  auto [logits_ok, logits_figure] = compare(logits.detach(), "logits");
  // Note [Parity tolerances]: on LibTorch 2 float32 logits are bitwise.
  const bool logits_bitwise = !bf16 && TORCH_VERSION_MAJOR >= 2;
  if (logits_bitwise) logits_ok = logits_figure == 0;
  const double logits_diff_to_eager = diff_to_eager;
  const double logits_sdpa_ratio = sdpa_ratio;
  sdpa_ratio = worst_ratio = diff_to_eager = 0;
  double worst_grad = 0, grad_scale = 0;
  std::string worst_name;
  int grads = 0;
  bool grads_ok = true;
  for (const auto& item : model->named_parameters()) {
    const std::string key = "grad." + item.key();
    if (!ref.count(key)) {
      ok = report(false, name + ": transformers has no gradient for " + item.key());
      continue;
    }
    const auto [good, figure] = compare(item.value().grad(), key);
    grads_ok = grads_ok && good;
    grad_scale = std::max(grad_scale, max_abs(ref.at(key)));
    if (figure >= worst_grad) {
      worst_grad = figure;
      worst_name = item.key();
    }
    ++grads;
  }
  const std::string head = name + " (" + arch + ", stored " +
                           c["stored"].get<std::string>() + ", computed " +
                           c["dtype"].get<std::string>() +
                           (c["sharded"].get<bool>() ? ", sharded" : "") + "): ";
  if (!bf16) {
    ok = report(logits_ok, head + "logits max |diff| " + fmt(logits_figure) +
                               " (max |logit| " + fmt(max_abs(ref["logits"])) +
                               (logits_bitwise ? ", bitwise required: LibTorch 2)"
                                               : ", tolerance 1e-5)")) && ok;
    ok = report(grads_ok, head + std::to_string(grads) +
                              " gradients, max |diff| " + fmt(worst_grad) +
                              " in " + worst_name + " (max |grad| " +
                              fmt(grad_scale) + ", tolerance 1e-5)") && ok;
  } else {
    ok = report(logits_ok, head + "logits: zerostep's distance to the fp32 "
                                  "reference is " + fmt(logits_figure) +
                               "x transformers' eager bf16's (tolerance 2x; "
                               "its sdpa: " + fmt(logits_sdpa_ratio) +
                               "x; max |zerostep - eager| " +
                               fmt(logits_diff_to_eager) + ")") && ok;
    ok = report(grads_ok, head + std::to_string(grads) +
                              " gradients: worst distance ratio " +
                              fmt(worst_grad) + " in " + worst_name +
                              " (tolerance 2x; transformers' sdpa there: " +
                              fmt(sdpa_ratio) + "x; max |zerostep - eager| " +
                              fmt(diff_to_eager) + " over all gradients)") && ok;
  }
  // Ranges of the files transformers wrote: any [offset, offset + numel)
  // of a tensor equals those elements of the whole tensor, for every
  // tensor (single or sharded files, F32, BF16 or F16).
  {
    const HfCheckpointSource source(out + "/" + name);
    bool same = true;
    for (const auto& [tensor, info] : source.tensors()) {
      const int64_t n = info.numel();
      std::vector<float> whole(n), part(n / 3 + 1);
      source.read(tensor, 0, n, whole.data());
      const int64_t first = n / 3, count = n - first > n / 3 ? n / 3 : n - first;
      source.read(tensor, first, count, part.data());
      same = same && std::memcmp(part.data(), whole.data() + first,
                                 static_cast<size_t>(count) * 4) == 0;
    }
    ok = report(same, head + "every tensor's middle third read alone equals "
                             "the whole read's (" +
                             std::to_string(source.tensors().size()) +
                             " tensors)") && ok;
  }
  // The widening is exact: float32 arithmetic on the stored values gives
  // transformers' float32 logits on them.
  if (c["stored"] != "float32") {
    HfCausalLm wide = load_hf_decoder(out + "/" + name);
    const double diff = max_abs(wide->forward(ref["tokens"]).detach() - ref["fp32.logits"]);
    ok = report(diff <= 1e-5, head + "read as float32: logits max |diff| " +
                                  fmt(diff) + " (tolerance 1e-5)") && ok;
  }
  return ok;
}

// Trains `base` (LoRA adapters when lora.rank > 0, else every parameter)
// for 3 AdamW steps at ZeRO stage 3 on 2 simulated ranks, each rank on its
// own row of `tokens`; exports through the engine to `weights_file`;
// returns the trained model's logits on `tokens`.
torch::Tensor train_and_export(const std::string& base, const HfLoraOptions& lora,
                               const torch::Tensor& tokens,
                               const torch::Tensor& targets,
                               const std::string& weights_file) {
  const int world = 2;
  SimWorld sim(SimOptions{world, 7});
  const Config config = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
                                "stage3_param_persistence_threshold": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
      world);
  std::vector<HfCausalLm> models;
  for (int r = 0; r < world; ++r) {
    HfDecoderOptions o;
    o.lora = lora;
    models.push_back(load_hf_decoder(base, o));
    if (lora.rank > 0) freeze_all_but_lora(*models.back());
  }
  std::vector<std::unique_ptr<Engine>> engines(world);
  torch::Tensor logits;
  sim.run([&](int r) {
    engines[r] = std::make_unique<Engine>(models[r].ptr(), config, &sim.comm(r));
    for (int step = 0; step < 3; ++step) {
      engines[r]->backward(loss_of(models[r]->forward(tokens.narrow(0, r, 1)),
                                   targets.narrow(0, r, 1)));
      engines[r]->step();
    }
    engines[r]->export_full_model(weights_file);
    torch::NoGradGuard no_grad;
    torch::Tensor l = models[r]->forward(tokens);  // gathers: every rank
    if (r == 0) logits = l;
  });
  return logits;
}

bool write_exports(const std::string& out) {
  const std::string dir = out + "/exports";
  std::filesystem::create_directories(dir);
  nlohmann::json listing = nlohmann::json::array();
  bool ok = true;
  auto ref = read_tensors(out + "/ref/llama_bias_sharded.safetensors");
  const torch::Tensor tokens = ref["tokens"], targets = ref["targets"];

  // LoRA adapters on every projection and the head (Note [The head's
  // LoRA] in hf_decoder.h), trained at stage 3, in PEFT's format: an
  // untied Llama (the head's own weight) and a tied one (the embedding's).
  HfLoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.seed = 3;
  lora.target_modules.push_back("lm_head");
  for (const char* name : {"llama_bias_sharded", "llama3_tied"}) {
    const std::string base = out + "/" + name;
    const std::string n = name;
    const torch::Tensor lora_logits = train_and_export(
        base, lora, tokens, targets, dir + "/lora_" + n + ".safetensors");
    write_peft_adapter(dir + "/lora_" + n + ".safetensors", lora, base,
                       dir + "/adapter_" + n);
    write_tensors(dir + "/adapter_logits_" + n + ".safetensors",
                  {{"tokens", tokens}, {"logits", lora_logits}});
    listing.push_back({{"name", n + " LoRA r=4 alpha=8 with lm_head"},
                       {"kind", "peft"},
                       {"base", base},
                       {"folder", dir + "/adapter_" + n},
                       {"logits", "adapter_logits_" + n + ".safetensors"}});
  }

  // A full fine-tune at stage 3 of a tied Qwen3, exported by the engine.
  const std::string qwen3 = out + "/qwen3";
  const std::string full = dir + "/qwen3_full";
  copy_hf_folder_metadata(qwen3, full);
  const torch::Tensor full_logits =
      train_and_export(qwen3, HfLoraOptions{}, tokens, targets,
                       full + "/" + kHfWeightsFile);
  write_tensors(dir + "/full_logits.safetensors",
                {{"tokens", tokens}, {"logits", full_logits}});
  listing.push_back({{"name", "qwen3 fine-tuned at stage 3"},
                     {"kind", "full"},
                     {"folder", full},
                     {"logits", "full_logits.safetensors"}});

  // A folder written here from a model built here (Llama, llama3 RoPE,
  // GQA, untied).
  HfDecoderConfig c = hf_config_for(HfArchitecture::kLlama);
  c.vocab_size = 96;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.initializer_range = 0.1;
  c.llama3_rope = true;
  c.rope_theta = 500000;
  c.rope_factor = 32;
  c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4;
  c.rope_original_max_position_embeddings = 16;
  HfCausalLm built = make_hf_decoder(c);
  init_hf_decoder_weights(*built, 21);
  save_hf_folder(*built, dir + "/built_here");
  torch::NoGradGuard no_grad;
  write_tensors(dir + "/built_logits.safetensors",
                {{"tokens", tokens}, {"logits", built->forward(tokens)}});
  listing.push_back({{"name", "Llama built and saved by zerostep"},
                     {"kind", "full"},
                     {"folder", dir + "/built_here"},
                     {"logits", "built_logits.safetensors"}});
  std::ofstream(dir + "/exports.json") << listing.dump(2) << "\n";
  std::cout << "wrote " << listing.size() << " exports to " << dir << std::endl;
  return ok;
}

int run(const std::string& out) {
  torch::set_num_threads(1);
  std::ifstream in(out + "/cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in);
  std::cout << "reference: transformers " << cases["transformers"].get<std::string>()
            << ", torch " << cases["torch"].get<std::string>() << std::endl;
  bool ok = true;
  for (const nlohmann::json& c : cases["cases"]) ok = check_case(out, c) && ok;
  ok = write_exports(out) && ok;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hf_parity_check OUT (a folder hf_parity.py make wrote)\n";
    return 2;
  }
  try {
    return zerostep::run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "hf_parity_check: " << e.what() << "\n";
    return 1;
  }
}
