"""c10d Gloo's reduce-scatter and all-gather against the same data moved by
Gloo's point-to-point send/recv, and an all-reduce and a memcpy of it, on 2
processes of this machine (PyPI torch, Gloo over loopback, 1 thread each).

    /var/cache/zerostep/torch-2.11.0-*/bin/python \\
        benchmarks/peers/gloo_collectives.py [--numel=26298880] [--reps=7] [--out=F.json]

Why zerostep's GlooCommunicator moves its reduce-scatter and all-gather by
point-to-point (Note [Gloo reduce-scatter and all-gather] in
comm/gloo_world.cc); docs/benchmarks.md keeps the figures. Prints one line
per operation (median of --reps after one warm-up) and, with --out, JSON.
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ports import master_port  # beside this file


def rank_main(rank, port, numel, reps, queue):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    other = 1 - rank
    x = torch.randn(numel)
    half = torch.empty(numel // 2)
    full = torch.empty(numel)
    scratch = torch.empty(numel // 2)
    chunks = x.chunk(2)

    def p2p_reduce_scatter():
        s = dist.isend(chunks[other], other, tag=1)
        r = dist.irecv(scratch, other, tag=1)
        r.wait()
        torch.add(chunks[rank], scratch, out=half)
        s.wait()

    def p2p_all_gather():
        outs = full.chunk(2)
        outs[rank].copy_(half)
        s = dist.isend(outs[rank], other, tag=2)
        r = dist.irecv(outs[other], other, tag=2)
        r.wait()
        s.wait()

    ops = [
        ("c10d all_reduce", lambda: dist.all_reduce(x)),
        ("c10d reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(half, x)),
        ("c10d all_gather_into_tensor", lambda: dist.all_gather_into_tensor(full, half)),
        ("p2p reduce_scatter", p2p_reduce_scatter),
        ("p2p all_gather", p2p_all_gather),
        ("memcpy of the buffer", lambda: full.copy_(x)),
    ]
    result = {}
    for name, fn in ops:
        fn()
        dist.barrier()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
            dist.barrier()
        result[name] = {"median_ms": statistics.median(times) * 1e3,
                        "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3}
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=26298880,
                   help="float32 elements of the buffer (default: the 26M peers model)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out")
    a = p.parse_args()
    queue = mp.get_context("fork").SimpleQueue()
    mp.start_processes(rank_main, args=(master_port(), a.numel, a.reps, queue),
                       nprocs=2, start_method="fork")
    result = queue.get()
    for name, r in result.items():
        print("%-30s %8.1f ms  (%.1f-%.1f)" % (name, r["median_ms"], r["min_ms"], r["max_ms"]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"numel": a.numel, "bytes": a.numel * 4, "reps": a.reps,
                       "torch": torch.__version__, "cpu": cpu_model(),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "results": result}, f, indent=1)


if __name__ == "__main__":
    main()
