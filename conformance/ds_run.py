#!/usr/bin/env python3
"""The DeepSpeed side of the conformance run (conformance/, issue 47).

  python ds_run.py --dir=RUN --world=2 [--cases=a,b]

Runs every case of RUN/cases.json whose world is --world (or those named)
under DeepSpeed 0.19.8 on its CPU accelerator, in --world processes over
Gloo, one thread each, and writes RUN/deepspeed/<case>.json and .params
(formats: conformance/cases.py). Each case: the tiny GPT of
benchmarks/peers/torch_step.py, its weights read from the case's file,
deepspeed.initialize with the case's ds_config (DeepSpeed builds its own
optimizer from the config's "optimizer" block: its CPU FusedAdam; for the
cases whose "optimizer" is "formula", formula_adamw below instead), and for each step N
micro-batches of RUN/data.bin: engine(x), the mean cross-entropy of the
float32 logits, engine.backward(loss); unmanaged: engine.step() after the
N-th, managed: after each.

fp16: DeepSpeed's CPU accelerator refuses fp16 unless oneDNN has fp16
kernels for this CPU (torch.ops.mkldnn._is_mkldnn_fp16_supported(); false on
AVX2 CPUs). The refusal is a capability check, not a numerical one: LibTorch
runs fp16 CPU ops either way (slowly), so this driver lifts it for its own
process (docs/design/conformance.md, "Same numbers as DeepSpeed").
Its shared-memory all-reduce op, used only by inference_all_reduce, is not
built (training's collectives are Gloo's either way).
"""
import argparse
import datetime
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks", "peers"))
import cases as C  # noqa: E402
from ports import master_port  # noqa: E402  (benchmarks/peers)

DEEPSPEED_VERSION = "0.19.8"


def zerostep_name(name):
    """blocks.0.qkv.weight (torch_step's module names) -> block0.qkv.weight
    (models/tiny_gpt.cc's)."""
    if name.startswith("blocks."):
        _, index, rest = name.split(".", 2)
        return "block%s.%s" % (index, rest)
    return name


def build_model():
    import torch_step
    # torch_step's GPT of these shapes, not a Hugging Face folder (--hf).
    a = argparse.Namespace(hf=None, **C.SHAPE)
    return torch_step.build_model(a)


def load_weights(model, path):
    import torch
    file = C.read_safetensors(path)
    names = [zerostep_name(n) for n, _ in model.named_parameters()]
    if sorted(names) != sorted(file):
        raise SystemExit("ds_run: %s holds %s, the model has %s" % (path, sorted(file), sorted(names)))
    with torch.no_grad():
        for (n, p), z in zip(model.named_parameters(), names):
            shape, data = file[z]
            if list(p.shape) != shape:
                raise SystemExit("ds_run: %s: shape %s in %s, %s in the model" % (z, shape, path,
                                                                                   list(p.shape)))
            p.copy_(torch.frombuffer(bytearray(data), dtype=torch.float32).view(p.shape))


def read_data(run):
    import torch
    with open(os.path.join(run, "data.bin"), "rb") as f:
        blob = bytearray(f.read())
    t = torch.frombuffer(blob, dtype=torch.int64)
    return t.view(C.MICRO_MAX, C.WORLD_MAX, C.MICRO_BATCH, C.SHAPE["block_size"] + 1)


def full_fp32(engine, stage):
    """Every parameter's fp32 master value, concatenated in registration
    order (a collective at stage 3: every rank calls it)."""
    import torch
    from deepspeed.utils import safe_get_full_fp32_param
    flat = getattr(engine.optimizer, "fp32_groups_flat", None)
    if flat is not None:
        # FP16_Optimizer (stage 0 under fp16 or bf16): one float32 master
        # per parameter group, its parameters' values in group order (one
        # group here: the model's parameters in registration order).
        return torch.cat([f.detach().reshape(-1) for f in flat]).cpu()
    out = []
    for p in engine.module.parameters():
        v = safe_get_full_fp32_param(p)
        if v is None:  # no wrapper (stage 0, fp32): the parameter itself
            v = p.detach()
        out.append(v.detach().float().reshape(-1).cpu())
    return torch.cat(out)


def fp16_mask_fill():
    """torch_step's causal mask fills with -1e9, which fp16 cannot hold
    (masked_fill raises). Under fp16 this makes a fill below the format's
    range the format's lowest finite value: after softmax's max
    subtraction both weigh the masked keys exactly 0."""
    import torch
    plain = torch.Tensor.masked_fill

    def masked_fill(self, mask, value):
        if self.dtype == torch.float16 and isinstance(value, float):
            value = max(value, torch.finfo(torch.float16).min)
        return plain(self, mask, value)

    torch.Tensor.masked_fill = masked_fill
    return plain


def formula_adamw(params, lr, betas, eps, weight_decay):
    """AdamW in the order of operations of zerostep's kernel
    (offload/fused_adam.h: each operation rounded to float32, no FMA, the
    per-step scalars computed in double and rounded once), written with
    LibTorch's elementwise CPU ops, whose float32 multiply, add, sqrt and
    divide round once each. Given to DeepSpeed as a client optimizer
    (zero_allow_untested_optimizer), it makes the two sides' updates the
    same function, so the rest of the step (scaling, reduction, clipping,
    the schedule, the stages' partitions) is compared bit for bit."""
    import torch

    class FormulaAdamW(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                          weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                b1, b2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["step"] = 0
                        st["m"] = torch.zeros_like(p, dtype=torch.float32)
                        st["v"] = torch.zeros_like(p, dtype=torch.float32)
                    st["step"] += 1
                    t, g, m, v = st["step"], p.grad.float(), st["m"], st["v"]
                    lr_t = group["lr"]
                    p.mul_(1.0 - lr_t * group["weight_decay"])
                    m.mul_(b1).add_(g * (1.0 - b1))
                    v.mul_(b2).add_((g * (1.0 - b2)) * g)
                    # sqrt in double, rounded once: float32 Tensor.sqrt() on the CPU is
                    # not always correctly rounded (docs/design/conformance.md).
                    denom = v.double().sqrt().float().mul_(1.0 / math.sqrt(1.0 - b2 ** t))
                    denom.add_(group["eps"])
                    p.sub_((m / denom).mul_(lr_t / (1.0 - b1 ** t)))

    return FormulaAdamW(params)


def run_case(case, run, data, rank):
    import torch
    import deepspeed

    torch.manual_seed(C.SEED)
    model = build_model()
    load_weights(model, os.path.join(run, case["weights"]))
    config = json.loads(json.dumps(case["config"]))
    optimizer = None
    if case["optimizer"] == "formula":
        hyper = config.pop("optimizer")["params"]
        config["zero_allow_untested_optimizer"] = True
        optimizer = formula_adamw(model.parameters(), **hyper)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           optimizer=optimizer, config=config)
    managed = case["mode"] == "managed"
    losses, steps, params = [], [], []
    micro = 0
    for n in case["steps"]:
        for i in range(n):
            batch = data[micro, rank]
            micro += 1
            x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
            logits = engine(x).to(torch.float32)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, C.SHAPE["vocab"]), y.view(-1))
            losses.append(loss.item())
            engine.backward(loss)
            last = i == n - 1
            if managed or last:
                lr = engine.get_lr()[0]
                before = engine._get_optimizer_loss_scale() if case["dtype"] == "fp16" else 1.0
                engine.step()
        norm = engine.get_global_grad_norm()
        if torch.is_tensor(norm):
            norm = norm.item()
        scale = engine._get_optimizer_loss_scale() if case["dtype"] == "fp16" else 1.0
        steps.append({"lr": lr, "applied": bool(engine.was_step_applied()),
                      "grad_norm": None if norm is None else float(norm),
                      "loss_scale": float(scale), "loss_scale_before": float(before),
                      "skipped_steps": int(engine.skipped_steps),
                      "global_steps": int(engine.global_steps)})
        params.append(full_fp32(engine, case["stage"]))
    engine.destroy()
    return losses, steps, params


def rank_main(rank, a, port, names):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.world),
                      LOCAL_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=300))
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    if deepspeed.__version__ != DEEPSPEED_VERSION:
        raise SystemExit("ds_run: DeepSpeed %s is not %s" % (deepspeed.__version__,
                                                             DEEPSPEED_VERSION))
    accel = get_accelerator()
    accel.is_fp16_supported = lambda: True  # see the module's docstring
    # DeepSpeed's shared-memory all-reduce serves inference_all_reduce only
    # (training's collectives are torch.distributed's Gloo ones): not
    # JIT-built, which saves minutes of compiling on a fresh machine.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    data = read_data(a.dir)
    out = os.path.join(a.dir, "deepspeed")
    all_cases = json.load(open(os.path.join(a.dir, "cases.json")))
    runtime = "deepspeed=%s torch=%s %s threads=%d" % (
        deepspeed.__version__, torch.__version__, torch.backends.cpu.get_cpu_capability(),
        torch.get_num_threads())
    for case in all_cases:
        if case["world"] != a.world or (names and case["name"] not in names):
            continue
        plain = fp16_mask_fill() if case["dtype"] == "fp16" else None
        linear = torch.nn.functional.linear
        try:
            losses, steps, params = run_case(case, a.dir, data, rank)
        finally:
            if plain is not None:
                torch.Tensor.masked_fill = plain
            # A stage 3 engine replaces torch.nn.functional.linear
            # process-wide with its own (matmul, then += bias: two roundings
            # in bf16) and leaves it so; each case gets what a fresh
            # process would (docs/design/conformance.md, "Same numbers as
            # DeepSpeed").
            torch.nn.functional.linear = linear
        gathered = [None] * a.world
        dist.all_gather_object(gathered, losses)
        if rank == 0:
            record = {"losses": gathered, "steps": steps, "runtime": runtime}
            with open(os.path.join(out, case["name"] + ".json"), "w") as f:
                json.dump(record, f)
            with open(os.path.join(out, case["name"] + ".params"), "wb") as f:
                for p in params:
                    f.write(p.numpy().tobytes() if hasattr(p, "numpy") else bytes(p))
            print("deepspeed %s: done" % case["name"], file=sys.stderr, flush=True)
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--cases", default="")
    a = p.parse_args(argv)
    os.makedirs(os.path.join(a.dir, "deepspeed"), exist_ok=True)
    names = set(a.cases.split(",")) - {""}
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a, master_port(), names), nprocs=a.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
