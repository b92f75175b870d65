"""The conformance cases (issue 47): one ds_config per (stage, dtype, mode,
variant), the shared inputs, and the file formats both sides read and write.

Torch-free: the driver (conform.py), the DeepSpeed side (ds_run.py) and the
comparer import it; only ds_run.py imports torch.

Files of one run, in its folder:
  cases.json     [{"name", "stage", "dtype", "mode", "variant", "world",
                   "steps": [N per step], "config": ds_config}, ...]
  weights_<dtype>.safetensors  the initial weights, F32, zerostep's
                 parameter names (block0.qkv.weight ...), written once from
                 a seeded model; for bf16 and fp16 rounded to the format
                 first (DeepSpeed's master weights start from the model's
                 16-bit copy, zerostep's from the float32 values given:
                 docs/design/conformance.md, "Same numbers as DeepSpeed")
  data.bin       int64 tokens [MICRO_MAX, WORLD_MAX, MICRO_BATCH, BLOCK + 1],
                 little-endian, row-major: rank r's i-th micro-batch of a
                 case is data[i, r] (inputs [:, :-1], targets [:, 1:])
  <side>/<case>.json   rank 0's record (below), <side> deepspeed or zerostep
  <side>/<case>.params float32 [len(steps), numel]: the full fp32 (master)
                 parameters after each step, concatenated in the model's
                 registration order

A record: {"losses": [[per micro-batch loss of rank r, unscaled, in order]
for each rank], "steps": [{"lr": lr of this step's update (read before
step()), "applied": bool, "grad_norm": float or null, "loss_scale": float
(after the step), "loss_scale_before": float (the scale of this step's
backward calls),
"skipped_steps": int, "global_steps": int}], "runtime": str}.
"""
import json
import struct

# The tiny GPT of models/tiny_gpt.h (benchmarks/peers/torch_step.py builds
# the same modules in Python).
SHAPE = {"vocab": 64, "d_model": 32, "n_layer": 2, "n_head": 2, "block_size": 16}
MICRO_BATCH = 2
SEED = 47
# Unmanaged: N backward() calls, then one step(), N per step; the loss is
# divided by the configured gradient_accumulation_steps (DeepSpeed's
# scale_wrt_gas, zerostep's "configured" scaling).
UNMANAGED_STEPS = [3, 1, 4]
# Managed: gradient_accumulation_steps = MANAGED_GAS, one (backward, step)
# pair per micro-batch; the counter makes every MANAGED_GAS-th step() the
# boundary.
MANAGED_GAS = 3
MANAGED_STEPS = [3, 3, 3]
MICRO_MAX = max(sum(UNMANAGED_STEPS), sum(MANAGED_STEPS))
WORLD_MAX = 3

STAGES = (0, 1, 2, 3)
DTYPES = ("fp32", "bf16", "fp16")
MODES = ("unmanaged", "managed")
# plain: constant lr, no clipping. clip: WarmupDecayLR from a non-zero lr,
# and gradient_clipping between the steps' norms (about 0.4-0.8 here), so
# that some steps clip and others do not: Adam's update is blind to a clip
# factor that is the same at every step, not to one that changes.
VARIANTS = ("plain", "clip")
CLIP = 0.5


def ds_config(stage, dtype, mode, variant, world):
    gas = UNMANAGED_STEPS[0] if mode == "unmanaged" else MANAGED_GAS
    c = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * world,
        "managed_gradient_accumulation": mode == "managed",
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                 "weight_decay": 0.01}},
        "steps_per_print": 1 << 30,
    }
    if stage == 3:
        # Every parameter partitioned, as zerostep_step's stage3.
        c["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        # A small initial scale and window: the run sees both an overflow
        # (skipped step, scale halved) and a growth.
        c["fp16"] = {"enabled": True, "initial_scale_power": 21, "loss_scale_window": 2,
                     "hysteresis": 1, "min_loss_scale": 1}
        # DeepSpeed's fp16 gradients accumulate in the fp16 .grad (its
        # default); zerostep's default accumulates in float32. Said on both
        # sides, so a window's sum overflows on both or neither.
        c["data_types"] = {"grad_accum_dtype": "fp16"}
    if variant == "clip":
        c["gradient_clipping"] = CLIP
        c["scheduler"] = {"type": "WarmupDecayLR",
                          "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-3,
                                     "warmup_num_steps": 2, "total_num_steps": 8}}
    return c


# The DeepSpeed side's optimizer: "deepspeed", the one DeepSpeed builds from
# the config's "optimizer" block (on its CPU accelerator: FusedAdam, a
# JIT-built C++ op); "formula", zerostep's AdamW order of operations
# written in LibTorch ops and given to DeepSpeed as a client optimizer
# (ds_run.formula_adamw), so the rest of the step is compared bit for bit.
OPTIMIZERS = ("deepspeed", "formula")


def case_name(stage, dtype, mode, variant, world, optimizer="deepspeed"):
    return "w%d_stage%d_%s_%s_%s%s" % (world, stage, dtype, mode, variant,
                                       "" if optimizer == "deepspeed" else "_" + optimizer)


def make_cases(worlds, stages=STAGES, dtypes=DTYPES, modes=MODES, variants=VARIANTS,
               optimizer="deepspeed"):
    out = []
    for world in worlds:
        for stage in stages:
            for dtype in dtypes:
                for mode in modes:
                    for variant in variants:
                        out.append({
                            "name": case_name(stage, dtype, mode, variant, world, optimizer),
                            "world": world, "stage": stage, "dtype": dtype, "mode": mode,
                            "variant": variant, "optimizer": optimizer,
                            "steps": UNMANAGED_STEPS if mode == "unmanaged" else MANAGED_STEPS,
                            "config": ds_config(stage, dtype, mode, variant, world),
                            "weights": "weights_%s.safetensors" % dtype,
                        })
    return out


def write_safetensors(path, tensors):
    """tensors: [(name, shape, float32 little-endian bytes)] -> an F32
    safetensors file (the format of engine/safetensors.h)."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors:
            f.write(data)


def read_safetensors(path):
    """{name: (shape, bytes)} of an F32 safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, h in header.items():
        if h["dtype"] != "F32":
            raise ValueError("%s: tensor %s has dtype %s, not F32" % (path, name, h["dtype"]))
        b, e = h["data_offsets"]
        out[name] = (h["shape"], blob[base + b:base + e])
    return out
