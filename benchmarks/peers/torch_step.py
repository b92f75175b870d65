#!/usr/bin/env python3
"""The PyTorch side of the peer benchmark (benchmarks/peers/, docs/benchmarks.md).

  python torch_step.py --modes=ddp,fsdp2 --vocab=4096 --d-model=256 --n-layer=6
      --n-head=4 --block-size=64 --micro-batch=4 --backwards=4 --threads=1

Starts --world processes (torch.multiprocessing, gloo on loopback), each
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
           calls and True for the last (one reduce-scatter per window).
Rank 0 prints one JSON line per mode on stdout with the same fields as
zerostep_step (the forward+backward times are the same in every line), with
a window split into forward_s_median (the N loss computations),
backward_s_median (the N backward calls) and step_s_median (opt.step() and
zero_grad()).
--count-params prints the parameter count of the shape and exits (no
processes, no timing).
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="ddp", help="comma-separated: ddp, fsdp2")
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
    a = p.parse_args(argv)
    a.modes = a.modes.split(",")
    if not a.modes or set(a.modes) - {"ddp", "fsdp2"}:
        p.error("--modes: a comma-separated list of ddp and fsdp2")
    if min(a.backwards, a.windows, a.threads, a.micro_batch, a.world) < 1 or a.warmup < 0:
        p.error("--backwards, --windows, --threads, --micro-batch and --world must be >= 1")
    return a


def build_model(a):
    """TinyGpt of models/tiny_gpt.cc, module for module (torch imported late:
    --help and the driver's checks stay fast)."""
    import torch
    from torch import nn

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
            mask = torch.ones(t, t, dtype=torch.bool).tril().logical_not()
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
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return Gpt()


def param_count(a):
    """TinyGpt's parameter count, by formula (no torch needed)."""
    d, v = a.d_model, a.vocab
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    return v * d + a.block_size * d + a.n_layer * block + 2 * d + d * v + v


def run_mode(a, mode, loss_of):
    """The timed windows of one mode: seconds per window, and their
    forward (N loss computations), backward (N backward calls) and step
    (optimizer step and zero_grad) parts."""
    import torch
    torch.manual_seed(a.seed)
    model = build_model(a)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (a.world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    # PyTorch's fused CPU AdamW kernel (zerostep's optimizer is a fused
    # kernel too: offload/fused_adam.h); zerostep_step's hyper-parameters.
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01,
                            fused=True)
    times = {"window": [], "forward": [], "backward": [], "step": []}
    for k in range(a.warmup + a.windows):
        t0 = time.perf_counter()
        fwd = bwd = 0.0
        for i in range(a.backwards):
            last = i == a.backwards - 1
            if mode == "ddp":
                sync = contextlib.nullcontext() if last else net.no_sync()
            else:
                net.set_requires_gradient_sync(last)
                sync = contextlib.nullcontext()
            with sync:
                tf = time.perf_counter()
                loss = loss_of(net, i)
                tb = time.perf_counter()
                loss.backward()
            fwd += tb - tf
            bwd += time.perf_counter() - tb
        ts = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if k >= a.warmup:
            now = time.perf_counter()
            times["window"].append(now - t0)
            times["step"].append(now - ts)
            times["forward"].append(fwd)
            times["backward"].append(bwd)
    return times


def rank_main(rank, a, port, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(a.seed)
    model = build_model(a)
    params = sum(p.numel() for p in model.parameters())
    if params != param_count(a):
        raise SystemExit("torch_step: the model has %d parameters, TinyGpt's formula %d"
                         % (params, param_count(a)))
    g = torch.Generator().manual_seed(a.seed + 1000 * rank)
    data = [torch.randint(a.vocab, (a.micro_batch, a.block_size + 1), generator=g)
            for _ in range(a.backwards)]
    micro = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]

    def loss_of(net, i):
        x, y = micro[i]
        return torch.nn.functional.cross_entropy(net(x).view(-1, a.vocab), y.view(-1)) / a.backwards

    # 1. Plain forward+backward.
    fwdbwd = []
    for k in range(a.warmup + a.windows):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for i in range(a.backwards):
            loss_of(model, i).backward()
        if k >= a.warmup:
            fwdbwd.append(time.perf_counter() - t0)
    del model

    # 2. Windows under DDP or FSDP2, a fresh model per mode.
    for mode in a.modes:
        times = run_mode(a, mode, loss_of)
        windows = times["window"]
        if rank == 0:
            queue.put({
                "framework": "torch", "mode": mode, "params": params, "world": a.world,
                "threads": a.threads, "micro_batch": a.micro_batch, "seq": a.block_size,
                "backwards": a.backwards, "window_s": windows,
                "window_s_median": statistics.median(windows), "fwdbwd_s": fwdbwd,
                "forward_s_median": statistics.median(times["forward"]),
                "backward_s_median": statistics.median(times["backward"]),
                "step_s_median": statistics.median(times["step"]),
                "fwdbwd_s_median": statistics.median(fwdbwd),
                "runtime": "torch=%s torch_threads=%d %s" % (
                    torch.__version__, torch.get_num_threads(),
                    torch.backends.cpu.get_cpu_capability()),
            })
    if rank == 0:
        queue.put(None)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    a = parse(argv)
    if a.count_params:
        print(param_count(a))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(a, free_port(), queue), nprocs=a.world,
                       start_method="spawn")
    for line in iter(queue.get, None):
        print(json.dumps(line, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
