#!/usr/bin/env python3
"""The PyTorch side of the peer benchmark (benchmarks/peers/, docs/benchmarks.md).

  python torch_step.py --modes=ddp,fsdp2 --vocab=4096 --d-model=256 --n-layer=6
      --n-head=4 --block-size=64 --micro-batch=4 --backwards=4 --threads=1

Starts --world processes (torch.multiprocessing; --device=cpu: gloo on
loopback; --device=cuda: one process per GPU on cuda:<rank>, nccl), each
building the same tiny GPT as zerostep's models/tiny_gpt.cc (token and
position embeddings, pre-LayerNorm blocks of causal attention and a GELU
MLP, a final LayerNorm, an untied LM head; the same parameter count), and
times, like benchmarks/peers/zerostep_step.cc:
  1. plain forward+backward, no wrapper: N backward calls per window into
     .grad (zeroed between windows), no communication, no optimizer;
  2. for each mode of --modes, in order, a fresh model, wrapper and
     optimizer, and its windows of N backward calls and one AdamW step:
     ddp   DistributedDataParallel, the first N-1 backward calls under
           no_sync() (one all-reduce, in the last backward);
     fsdp2 fully_shard on every block and then the root, with
           set_requires_gradient_sync(False) for the first N-1 backward
           calls and True for the last (one reduce-scatter per window);
     fsdp2_offload  the same with offload_policy=CPUOffloadPolicy()
           (parameters, gradients and the AdamW step on the host);
     eager the model alone with its AdamW, no wrapper and no
           communication (PyTorch eager, the peer of zerostep at one rank).
With --hf=DIR the model is the Hugging Face folder's, as transformers loads
it (AutoModelForCausalLM, float32, its default attention; fsdp2 shards
every decoder layer, then the root), in place of the GPT: torch's python
must have transformers (models/hf_py_requirements.txt), and the shape
flags but --block-size are unused.
Rank 0 prints one JSON line per mode on stdout with the same fields as
zerostep_step (the forward+backward times are the same in every line). On
the CPU a window is split into forward_s_median (the N loss computations),
backward_s_median (the N backward calls) and step_s_median (opt.step() and
zero_grad()); on cuda only whole windows are timed, with
torch.cuda.synchronize() before the first forward and after the step (the
host runs ahead of the device), and "memory" gives the CUDA caching
allocator's peak allocated and reserved bytes of the mode (cache emptied and
peaks reset when its model is made), what was still allocated then (the
baseline: the data, and anything an earlier mode's framework kept) and the
device memory in use at its end (torch.cuda.mem_get_info); "fwdbwd_memory" the same for plain
forward+backward.
--count-params prints the parameter count of the shape and exits (no
processes, no timing). benchmarks/peers/deepspeed_step.py runs DeepSpeed
through the same processes, data, timing and output (run_ranks below).
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import statistics
import sys
import time

from ports import master_port  # beside this file

TORCH_MODES = ("ddp", "fsdp2", "fsdp2_offload", "eager")


def parse(argv, modes=TORCH_MODES, description=None):
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    p.add_argument("--modes", default=modes[0], help="comma-separated: " + ", ".join(modes))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"],
                   help="default: gloo on cpu, nccl on cuda")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--backwards", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count-params", action="store_true")
    p.add_argument("--hf", help="a Hugging Face folder's model instead of the GPT")
    a = p.parse_args(argv)
    a.modes = a.modes.split(",")
    if not a.modes or set(a.modes) - set(modes):
        p.error("--modes: a comma-separated list of " + ", ".join(modes))
    if min(a.backwards, a.windows, a.threads, a.micro_batch, a.world) < 1 or a.warmup < 0:
        p.error("--backwards, --windows, --threads, --micro-batch and --world must be >= 1")
    a.backend = a.backend or ("nccl" if a.device == "cuda" else "gloo")
    if a.backend == "nccl" and a.device != "cuda":
        p.error("--backend=nccl needs --device=cuda")
    return a


def build_model(a):
    """TinyGpt of models/tiny_gpt.cc, module for module, or with --hf the
    folder's model, returning logits (torch imported late: --help and the
    driver's checks stay fast)."""
    import torch
    from torch import nn

    if a.hf:
        from transformers import AutoModelForCausalLM

        class Hf(nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = AutoModelForCausalLM.from_pretrained(a.hf, dtype=torch.float32)
                self.blocks = self.lm.model.layers

            def forward(self, tokens):
                return self.lm(input_ids=tokens, use_cache=False).logits

        model = Hf()
        a.vocab = model.lm.config.vocab_size
        return model

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = a.d_model
            self.n_head = a.n_head
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.fc_out = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, c = x.shape
            hd = c // self.n_head
            q, k, v = (y.view(b, t, self.n_head, hd).transpose(1, 2)
                       for y in self.qkv(self.ln1(x)).chunk(3, dim=-1))
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril().logical_not()
            att = att.masked_fill(mask, -1e9).softmax(-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc_out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(a.vocab, a.d_model)
            self.pos = nn.Embedding(a.block_size, a.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(a.n_layer))
            self.ln_f = nn.LayerNorm(a.d_model)
            self.head = nn.Linear(a.d_model, a.vocab)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return Gpt()


def param_count(a):
    """TinyGpt's parameter count, by formula (no torch needed)."""
    d, v = a.d_model, a.vocab
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    return v * d + a.block_size * d + a.n_layer * block + 2 * d + d * v + v


def make_torch_mode(a, mode, device):
    """A fresh model under `mode`'s wrapper and its optimizer: (net, within,
    backward, step) for time_windows."""
    import torch
    torch.manual_seed(a.seed)
    model = build_model(a).to(device)
    if mode == "eager":
        net = model
        set_sync = lambda last: contextlib.nullcontext()
    elif mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        set_sync = lambda last: contextlib.nullcontext() if last else net.no_sync()
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
        mesh = init_device_mesh(device.type, (a.world,))
        # Pinned host memory needs a CUDA driver: on the CPU (the smoke run)
        # the offload is a host-to-host no-op anyway.
        policy = (CPUOffloadPolicy(pin_memory=device.type == "cuda") if mode == "fsdp2_offload"
                  else OffloadPolicy())
        for block in model.blocks:
            fully_shard(block, mesh=mesh, offload_policy=policy)
        net = fully_shard(model, mesh=mesh, offload_policy=policy)

        def set_sync(last):
            net.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
    # PyTorch's fused AdamW kernel (zerostep's optimizer is a fused kernel
    # too: offload/fused_adam.h on the host, _fused_adamw_ on a device);
    # zerostep_step's hyper-parameters.
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def step(last):
        opt.step()
        opt.zero_grad(set_to_none=True)

    return net, set_sync, lambda loss, last: loss.backward(), step


def time_windows(a, net, within, backward, step, loss_of, sync, managed=False):
    """The timed windows of one mode: seconds per window, and their
    forward (N loss computations), backward (N backward calls) and step
    parts. within(last) is the context of one forward and its backward
    (DDP's no_sync() must hold the forward too), backward(loss, last) and
    step(last) are the framework's calls; managed: step(last) after every
    backward, else once after the N-th. sync() is called before the first
    forward and after the step only."""
    times = {"window": [], "forward": [], "backward": [], "step": []}
    for k in range(a.warmup + a.windows):
        sync()
        t0 = time.perf_counter()
        fwd = bwd = stp = 0.0
        for i in range(a.backwards):
            last = i == a.backwards - 1
            with within(last):
                tf = time.perf_counter()
                loss = loss_of(net, i)
                tb = time.perf_counter()
                backward(loss, last)
                ts = time.perf_counter()
            fwd += tb - tf
            bwd += ts - tb
            if managed or last:
                step(last)
                stp += time.perf_counter() - ts
        sync()
        if k >= a.warmup:
            times["window"].append(time.perf_counter() - t0)
            times["step"].append(stp)
            times["forward"].append(fwd)
            times["backward"].append(bwd)
    return times


def torch_mode(a, mode, device, loss_of, sync):
    net, within, backward, step = make_torch_mode(a, mode, device)
    # The wrappers' loss is divided by N here (DeepSpeed's engine divides).
    return time_windows(a, net, within, backward, step,
                        lambda n, i: loss_of(n, i) / a.backwards, sync)


def memory_reset(device):
    """Frees what an earlier mode left in the CUDA cache and restarts the
    allocator's peaks; returns the bytes still allocated (the baseline: the
    data, and whatever an earlier mode's framework kept), 0 on the CPU."""
    import gc
    import torch
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def memory_now(device, baseline):
    """The caching allocator's peaks since memory_reset, its baseline and
    the device memory in use (total - free), in bytes; {} on the CPU."""
    import torch
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"device_peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "device_peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_baseline_allocated_bytes": baseline,
            "device_in_use_bytes": total - free}


def rank_main(rank, a, port, queue, framework, run_mode):
    """One rank: process group, the model's plain forward+backward, then
    run_mode(a, mode, device, loss_of, sync) -> times for each mode (a
    ModeUnsupported instead: reported, not timed); rank 0 puts the JSON
    lines on `queue`, then None."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    device = torch.device("cuda", rank) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.world),
                      LOCAL_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group(a.backend, init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=300),
                            device_id=device if device.type == "cuda" else None)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.manual_seed(a.seed)
    baseline = memory_reset(device)
    model = build_model(a).to(device)
    params = sum(p.numel() for p in model.parameters())
    if not a.hf and params != param_count(a):
        raise SystemExit("torch_step: the model has %d parameters, TinyGpt's formula %d"
                         % (params, param_count(a)))
    g = torch.Generator().manual_seed(a.seed + 1000 * rank)
    data = [torch.randint(a.vocab, (a.micro_batch, a.block_size + 1), generator=g)
            for _ in range(a.backwards)]
    micro = [(d[:, :-1].contiguous().to(device), d[:, 1:].contiguous().to(device)) for d in data]

    def loss_of(net, i):
        """Mean cross-entropy of micro-batch i (not divided by N)."""
        x, y = micro[i]
        return torch.nn.functional.cross_entropy(net(x).view(-1, a.vocab), y.view(-1))

    # 1. Plain forward+backward.
    fwdbwd = []
    for k in range(a.warmup + a.windows):
        model.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        for i in range(a.backwards):
            (loss_of(model, i) / a.backwards).backward()
        sync()
        if k >= a.warmup:
            fwdbwd.append(time.perf_counter() - t0)
    fwdbwd_memory = memory_now(device, baseline)
    del model

    # 2. Windows under each mode, a fresh model per mode.
    for mode in a.modes:
        baseline = memory_reset(device)
        try:
            times = run_mode(a, mode, device, loss_of, sync)
        except ModeUnsupported as e:
            if rank == 0:
                queue.put({"framework": framework, "mode": mode, "params": params,
                           "device": a.device, "unsupported": str(e)})
            continue
        memory = memory_now(device, baseline)
        windows = times["window"]
        if rank == 0:
            line = {
                "framework": framework, "mode": mode, "params": params, "world": a.world,
                "device": a.device, "backend": a.backend,
                "threads": a.threads, "micro_batch": a.micro_batch, "seq": a.block_size,
                "backwards": a.backwards, "window_s": windows,
                "window_s_median": statistics.median(windows), "fwdbwd_s": fwdbwd,
                "fwdbwd_s_median": statistics.median(fwdbwd),
                "memory": memory, "fwdbwd_memory": fwdbwd_memory,
                "runtime": "torch=%s torch_threads=%d %s" % (
                    torch.__version__, torch.get_num_threads(),
                    torch.backends.cpu.get_cpu_capability()),
            }
            if device.type == "cpu":
                for phase in ("forward", "backward", "step"):
                    line[phase + "_s_median"] = statistics.median(times[phase])
            line.update(times.get("extra", {}))
            queue.put(line)
    if rank == 0:
        queue.put(None)
    dist.barrier()
    dist.destroy_process_group()


class ModeUnsupported(Exception):
    """A mode that the framework refuses on this device or build; its
    message is reported instead of a time."""


def run_ranks(a, framework, run_mode):
    """Starts a.world ranks of rank_main and prints rank 0's JSON lines."""
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(a, master_port(), queue, framework, run_mode),
                       nprocs=a.world, start_method="spawn")
    for line in iter(queue.get, None):
        print(json.dumps(line, sort_keys=True), flush=True)


def main(argv):
    a = parse(argv)
    if a.count_params:
        print(param_count(a))
        return 0
    run_ranks(a, "torch", torch_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
