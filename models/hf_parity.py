"""transformers' side of models/hf_parity_test.sh.

  hf_parity.py make OUT           small random folders of each architecture,
                                  and transformers' logits and gradients
  hf_parity.py check_exports OUT  zerostep's exports read by peft and
                                  transformers, logits compared

`make` writes OUT/cases.json and, per case, the folder OUT/<case>/ (as
save_pretrained writes it) and OUT/ref/<case>.safetensors: the tokens and
targets, transformers' logits and the gradient of every parameter after
one backward of the mean cross-entropy (named as named_parameters() names
them), computed in the case's dtype, and the same in float32 on the same
(rounded) weights ("fp32." prefix), from which the bf16 tolerance is
measured (models/hf_parity_check.cc, Note [bf16 parity tolerance]); for
bf16 also with transformers' eager attention ("eager." prefix; the
default is sdpa).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

BATCH, SEQ = 2, 24


def llama3_tied():
    return LlamaForCausalLM, LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=True,
        initializer_range=0.1, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                         "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16})


def llama_bias():
    return LlamaForCausalLM, LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=64, tie_word_embeddings=False,
        attention_bias=True, mlp_bias=True, initializer_range=0.1)


def qwen2():
    return Qwen2ForCausalLM, Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=False,
        initializer_range=0.1, rope_parameters={"rope_type": "default",
                                                "rope_theta": 1000000.0})


def qwen3():
    return Qwen3ForCausalLM, Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=64, tie_word_embeddings=True,
        initializer_range=0.1, rope_parameters={"rope_type": "default",
                                                "rope_theta": 1000000.0})


# name -> (builder, stored dtype, how it is saved)
CASES = {
    "llama3_tied": (llama3_tied, torch.float32, "legacy_config"),
    "llama_bias_sharded": (llama_bias, torch.float32, "sharded"),
    "qwen2": (qwen2, torch.float32, ""),
    "qwen3": (qwen3, torch.float32, ""),
    "llama3_tied_bf16": (llama3_tied, torch.bfloat16, ""),
    "qwen2_bf16": (qwen2, torch.bfloat16, ""),
    "qwen3_bf16": (qwen3, torch.bfloat16, ""),
    "qwen2_f16": (qwen2, torch.float16, ""),
}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16",
               torch.float16: "float16"}


def perturb(model, gen):
    """Norm weights and biases away from 1 and 0, so that their gradients and
    effects are not special cases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def legacy_config(path):
    """Rewrites a saved Llama config.json the way published Llama 3.x files
    spell RoPE: rope_theta at the top and "rope_scaling" with "type"."""
    with open(path) as f:
        c = json.load(f)
    rope = c.pop("rope_parameters")
    c["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    c["rope_scaling"] = rope
    c["torch_dtype"] = c.pop("dtype")
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def forward_backward(model, tokens, targets):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=tokens, use_cache=False).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                           targets.reshape(-1))
    loss.backward()
    out = {"logits": logits.detach().float().contiguous(),
           "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.detach().float().contiguous()
    return out


def make(out):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    cases = []
    for name, (build, dtype, how) in CASES.items():
        cls, config = build()
        torch.manual_seed(len(cases) + 1)
        model = cls(config).float()
        perturb(model, gen)
        model = model.to(dtype)
        folder = os.path.join(out, name)
        model.save_pretrained(folder,
                              max_shard_size="40KB" if how == "sharded" else "50GB")
        if how == "legacy_config":
            legacy_config(os.path.join(folder, "config.json"))
        # The reference is the folder as transformers reads it back.
        stored = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)
        targets = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)
        # f16: zerostep widens the stored values to float32 and computes in
        # float32; so does the reference.
        compute = torch.float32 if dtype == torch.float16 else dtype
        ref = forward_backward(stored.to(compute), tokens, targets)
        # float32 on the same stored values, from a model loaded as float32
        # (the bf16 model's .float() after its backward gave other logits
        # than a fresh float32 load, by 2e-3, in transformers 5.24).
        wide = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        ref.update({"fp32." + k: v for k, v in
                    forward_backward(wide, tokens, targets).items()})
        # bf16: the yardstick is transformers' eager attention, the
        # algorithm zerostep's decoders run (Note [bf16 parity tolerance]).
        if compute == torch.bfloat16:
            eager = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation="eager")
            ref.update({"eager." + k: v for k, v in
                        forward_backward(eager, tokens, targets).items()})
        ref["tokens"], ref["targets"] = tokens, targets
        save_file(ref, os.path.join(out, "ref", name + ".safetensors"))
        cases.append({"name": name, "dtype": DTYPE_NAMES[compute],
                      "stored": DTYPE_NAMES[dtype],
                      "sharded": os.path.exists(os.path.join(
                          folder, "model.safetensors.index.json"))})
        print(f"made {name}: {cls.__name__}, stored {DTYPE_NAMES[dtype]}, "
              f"{sum(p.numel() for p in model.parameters())} parameters",
              flush=True)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"transformers": transformers.__version__,
                   "torch": torch.__version__, "cases": cases}, f, indent=2)


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def check_exports(out):
    """Every export zerostep wrote (hf_parity_check.cc) gives zerostep's
    logits when transformers and peft load it."""
    import peft
    exports = os.path.join(out, "exports")
    ok = True
    with open(os.path.join(exports, "exports.json")) as f:
        listing = json.load(f)
    for e in listing:
        want = load_file(os.path.join(exports, e["logits"]))
        tokens = want["tokens"]
        if e["kind"] == "peft":
            base = AutoModelForCausalLM.from_pretrained(e["base"], dtype=torch.float32)
            base_logits = base(input_ids=tokens, use_cache=False).logits.detach()
            model = peft.PeftModel.from_pretrained(base, e["folder"])
        else:
            model = AutoModelForCausalLM.from_pretrained(e["folder"], dtype=torch.float32)
            base_logits = None
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=tokens, use_cache=False).logits
        diff = max_diff(logits, want["logits"])
        good = diff <= 1e-5
        line = (f"{e['name']}: {e['kind']} export read by "
                f"{'peft ' + peft.__version__ if e['kind'] == 'peft' else 'transformers ' + transformers.__version__}: "
                f"max |logit diff| {diff:.3g} (<= 1e-5)")
        if base_logits is not None:
            # The adapter must matter: its logits differ from the base's.
            moved = max_diff(base_logits, want["logits"])
            line += f"; the adapter moves the logits by {moved:.3g}"
            good = good and moved > 1e-3
            # Each lm_head adapter peft loaded trained (B left zero), and
            # peft wrapped the head: the tied embedding stays unadapted.
            adapters = load_file(os.path.join(e["folder"],
                                              "adapter_model.safetensors"))
            head_b = adapters.get("base_model.model.lm_head.lora_B.weight")
            if head_b is not None:
                head = model.base_model.model.lm_head
                wrapped = isinstance(head, peft.tuners.lora.LoraLayer)
                norm = head_b.abs().max().item()
                line += (f"; lm_head (tied: {base.config.tie_word_embeddings}) "
                         f"wrapped by peft: {wrapped}, max |lora_B| {norm:.3g}")
                good = good and wrapped and norm > 0
        print(("ok   " if good else "FAIL ") + line, flush=True)
        ok = ok and good
    return ok


def main():
    command, out = sys.argv[1], sys.argv[2]
    if command == "make":
        make(out)
    elif command == "check_exports":
        sys.exit(0 if check_exports(out) else 1)
    else:
        sys.exit(f"hf_parity.py: unknown command {command}")


if __name__ == "__main__":
    main()
