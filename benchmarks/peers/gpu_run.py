#!/usr/bin/env python3
"""zerostep against PyTorch FSDP2 and DeepSpeed on a GPU (issue 12 item 8; docs/benchmarks.md).

On the GPU node, from the pack that tools/gpu_check.sh makes (no Bazel there):

  python3 gpu_run.py --zerostep-bin=./zerostep_step --out=peers_gpu.json --table=peers_gpu.md

Here, the same plumbing on the CPU (tiny shapes, Gloo, a smoke run):

  python3 benchmarks/peers/gpu_run.py --device=cpu --quick --zerostep-bin=bazel-bin/...

Runs, interleaved in rounds (the order of the three frameworks rotates from
round to round and size to size), on GPT shapes of about 125M and 350M
parameters (the tiny GPT of models/tiny_gpt.h, written out module for module
in torch_step.py; the driver checks that every framework counts the same
parameters), N = 4 backward calls per optimizer step, fp32, AdamW:
  zerostep   zerostep_step --device=cuda --backend=nccl: stage0 to stage3
             (ZeRO state on the device), stage1_offload to stage3_offload
             (offload_optimizer cpu), and stage2_managed (managed
             accumulation, for the unmanaged / managed ratio); unmanaged
             windows otherwise. A mode the engine refuses is reported with
             its error, nothing is timed for it
  DeepSpeed  deepspeed_step.py (0.19.8): the same stages and offloads with
             managed_gradient_accumulation false, and stage2_managed
  FSDP2      torch_step.py: fully_shard, set_requires_gradient_sync(False)
             for the first N-1 backward calls; fsdp2_offload with
             CPUOffloadPolicy is the peer of the offload rows
With --hf=DIR[,DIR] the shapes are Hugging Face folders instead (Llama-shaped,
written by //tools:make_hf_model --preset=125m / 350m, which the pack
carries): zerostep loads each with models/hf_decoder.h, FSDP2 and DeepSpeed
with transformers (AutoModelForCausalLM; --hf-site names a folder holding
transformers for torch's python, put first on its PYTHONPATH), the same
folder on every side; the sizes are named by the folders.
World size 1 by default on cuda (one GPU: one process per GPU, NCCL), 2 on
the CPU (Gloo). Each launch times 1 warm-up and --windows windows per mode,
with one device synchronisation before and one after each window; the
table gives per (size, mode) the median over rounds of each launch's median
window, the peak memory of LibTorch's CUDA caching allocator (the same
counter on every side: torch.cuda.max_memory_allocated), and the ratios
peer / zerostep paired per round (median, range). A second table gives
unmanaged / managed window time at stage 2 for zerostep and DeepSpeed.
Rounds: up to --rounds, but a round that would end past --budget-s (judged
by the slowest round so far) is not started; the first always runs.
JSON (--out) holds every launch's lines, failures and refusals; the tables
go to stdout and --table. A framework whose launch fails is reported with
its error and the others still run; exit status 1 if zerostep or FSDP2
failed, 0 otherwise (DeepSpeed's state is "deepspeed" in the JSON).
"""
import argparse
import datetime
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ports import master_port  # noqa: E402  (ports.py and run.py sit beside this file, packed with it)
from run import cpu_model, model_args  # noqa: E402

# name: (vocab, d_model, n_layer, n_head); --block-size 512:
# 124,796,416 and 355,290,112 parameters (untied LM head).
GPU_SIZES = {"125M": (25600, 768, 12, 12), "350M": (25600, 1024, 24, 16)}
QUICK_SIZES = {"tiny": (64, 32, 2, 2)}
ZEROSTEP_MODES = ["stage0", "stage1", "stage2", "stage3", "stage1_offload", "stage2_offload",
                  "stage3_offload", "stage2_managed"]
DEEPSPEED_MODES = list(ZEROSTEP_MODES)
TORCH_MODES = ["fsdp2", "fsdp2_offload"]
ROWS = ["stage0", "stage1", "stage2", "stage3", "stage1_offload", "stage2_offload",
        "stage3_offload"]
MANAGED = ("stage2", "stage2_managed")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def launch(world, cmd, timeout_s, base_env):
    """Starts `world` copies of cmd with torchrun's variables (what
    tools/launch does); returns (exit status, rank 0's stdout, the ranks'
    stderr tail). A rank that fails stops the others."""
    port = master_port()
    procs = []
    for r in range(world):
        env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout_s
    outs, rc = [None] * world, 0
    for r, p in enumerate(procs):
        try:
            outs[r] = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            outs[r] = p.communicate()
            rc = rc or 124
        if p.returncode != 0:
            rc = rc or p.returncode
            for q in procs:
                if q.poll() is None:
                    q.kill()
    return rc, outs[0][0], clip("".join(o[1] for o in outs if o))


def clip(text, head=1500, tail=1500):
    """An error output's start (c10's message) and end (Python's)."""
    return text if len(text) <= head + tail else text[:head] + "\n[...]\n" + text[-tail:]


def headline(err):
    """The line of an error output that says what went wrong: c10 and
    UsageError put it first, a Python traceback last. Log lines (torch's
    "W1208 01:30:25.873000 ... Terminating process ...") are skipped: they
    say what happened next, not what went wrong."""
    text = re.sub(r"^exit -?\d+: ", "", (err or "").strip())
    lines = [l.strip() for l in text.splitlines()
             if l.strip() and not re.match(r"[IWEF]\d{4} \d\d:\d\d:\d\d", l.strip())]
    if not lines:
        return "?"
    first = lines[0]
    return lines[-1] if first.startswith("Traceback") or first.startswith("[") else first


def run_json(cmd, timeout_s, world=None, env=None):
    """Runs cmd (under launch() when world is given) with env (default this
    process's); (lines, error):
    the JSON objects it printed, and None or what went wrong."""
    if world is None:
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout_s, env=env)
            rc, out, err = p.returncode, p.stdout, clip(p.stderr)
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, e.stdout or "", "timed out after %d s" % timeout_s
            out = out.decode() if isinstance(out, bytes) else out
    else:
        rc, out, err = launch(world, cmd, timeout_s, env or os.environ)
    lines = []
    for line in (out or "").splitlines():
        brace = line.find("{")
        if brace >= 0:
            try:
                lines.append(json.loads(line[brace:]))
            except ValueError:
                pass
    if rc != 0:
        return lines, "exit %d: %s" % (rc, (err or "").strip())
    return lines, None


def shape_args(a, shape):
    return model_args(shape) + ["--block-size=%d" % a.block_size,
            "--micro-batch=%d" % a.micro_batch, "--backwards=%d" % a.backwards,
            "--threads=%d" % a.threads, "--warmup=%d" % a.warmup, "--windows=%d" % a.windows,
            "--device=" + a.device, "--backend=" + a.backend]


def spread(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def peak(line):
    """The mode's own peak: the CUDA caching allocator's peak allocated
    bytes less what was allocated when the mode began (the data, and
    anything an earlier mode's framework kept); None off the GPU."""
    m = (line or {}).get("memory") or {}
    if m.get("device_peak_allocated_bytes") is None:
        return None
    return m["device_peak_allocated_bytes"] - m.get("device_baseline_allocated_bytes", 0)


def summarize(runs, sizes):
    """Per (size, row): each framework's times and peaks over rounds and the
    paired ratios peer / zerostep; and the unmanaged / managed rows."""
    by = {}
    for r in runs:
        by.setdefault((r["size"], r["framework"], r["mode"]), {})[r["round"]] = r
    rows, managed = [], []
    for size in sizes:
        for mode in ROWS:
            peers = {"zerostep": mode, "deepspeed": mode,
                     "fsdp2": "fsdp2_offload" if mode.endswith("_offload") else "fsdp2"}
            row = {"size": size, "mode": mode, "peer_modes": peers}
            for fw, m in peers.items():
                got = by.get((size, "torch" if fw == "fsdp2" else fw, m), {})
                row[fw] = {
                    "rounds": sorted(got),
                    "window_s": spread([x["window_s_median"] for x in got.values()]),
                    "peak_allocated_bytes": spread([peak(x) for x in got.values()
                                                    if peak(x) is not None]),
                    "params": next((x["params"] for x in got.values()), None),
                }
            z = by.get((size, "zerostep", mode), {})
            for fw in ("deepspeed", "fsdp2"):
                p = by.get((size, "torch" if fw == "fsdp2" else fw, peers[fw]), {})
                both = sorted(set(z) & set(p))
                row["ratio_" + fw] = spread([p[k]["window_s_median"] / z[k]["window_s_median"]
                                             for k in both])
            rows.append(row)
        for fw in ("zerostep", "deepspeed"):
            u, m = (by.get((size, fw, x), {}) for x in MANAGED)
            both = sorted(set(u) & set(m))
            if both:
                managed.append({
                    "size": size, "framework": fw, "modes": list(MANAGED),
                    "unmanaged_s": spread([u[k]["window_s_median"] for k in both]),
                    "managed_s": spread([m[k]["window_s_median"] for k in both]),
                    "ratio": spread([u[k]["window_s_median"] / m[k]["window_s_median"]
                                     for k in both]),
                })
    return rows, managed


def gib(s):
    return "-" if not s else "%.2f" % (s["median"] / 2**30)


def secs(s):
    return "-" if not s else "%.3f" % s["median"]


def ratio(s):
    return "-" if not s else "**%.2f** (%.2f-%.2f)" % (s["median"], s["min"], s["max"])


def tables(result):
    """The markdown tables of a result (run or --from-json)."""
    unsupported = result.get("unsupported", {})
    failed = result.get("failures", {})
    params = {}
    for r in result["runs"]:
        params[r["size"]] = r["params"]
    out = ["| size (params) | mode | zerostep s | DeepSpeed s | FSDP2 s | **DeepSpeed / zs** (range) "
           "| **FSDP2 / zs** (range) | zerostep peak GiB | DeepSpeed peak GiB | FSDP2 peak GiB |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["summary"]:
        cells = {}
        for fw in ("zerostep", "deepspeed", "fsdp2"):
            key = "%s/%s/%s" % (r["size"], "torch" if fw == "fsdp2" else fw, r["peer_modes"][fw])
            if r[fw]["window_s"]:
                cells[fw] = secs(r[fw]["window_s"])
            elif key in unsupported:
                cells[fw] = "not supported on the device yet" if fw == "zerostep" else "not run"
            elif any(k.startswith("%s/%s" % (r["size"], "torch" if fw == "fsdp2" else fw))
                     for k in failed):
                cells[fw] = "failed"
            else:
                cells[fw] = "-"
        fsdp2 = r["fsdp2"]["window_s"] and r["peer_modes"]["fsdp2"]
        out.append("| %s (%s) | %s | %s | %s | %s%s | %s | %s | %s | %s | %s |" % (
            r["size"], format(params.get(r["size"], 0), ","), r["mode"], cells["zerostep"],
            cells["deepspeed"], cells["fsdp2"],
            " (%s)" % fsdp2 if fsdp2 and fsdp2 != "fsdp2" else "",
            ratio(r["ratio_deepspeed"]), ratio(r["ratio_fsdp2"]),
            gib(r["zerostep"]["peak_allocated_bytes"]), gib(r["deepspeed"]["peak_allocated_bytes"]),
            gib(r["fsdp2"]["peak_allocated_bytes"])))
    out += ["", "Window: N = %s backward calls and the step(s), median over rounds of each launch's "
            "median; ratios: peer window / zerostep window, paired per round (above 1: zerostep "
            "faster); peak: the CUDA caching allocator's peak allocated bytes during the mode, less what "
            "was allocated when it began (torch.cuda.max_memory_allocated on every side)." % (
                result.get("settings", {}).get("backwards_per_step", "?"))]
    out += ["", "| size | framework | stage2 unmanaged s | stage2 managed s | **unmanaged / managed** (range) |",
            "| --- | --- | --- | --- | --- |"]
    for m in result["managed"]:
        out.append("| %s | %s | %s | %s | %s |" % (m["size"], m["framework"], secs(m["unmanaged_s"]),
                                                  secs(m["managed_s"]), ratio(m["ratio"])))
    notes = []
    for key, why in sorted(unsupported.items()):
        notes.append("- %s: not run: %s" % (key, why.splitlines()[0][:400]))
    for key, why in sorted(failed.items()):
        notes.append("- %s: FAILED: %s" % (key, headline(why)[:400]))
    if result.get("deepspeed") != "ran":
        notes.append("- DeepSpeed: %s" % result.get("deepspeed"))
    if notes:
        out += [""] + notes
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def report(a, argv, sizes, runs, unsupported, failures, round_s, started, t_start, complete):
    """The result so far, written to --out and --table (after every launch,
    so that a run stopped from outside leaves what it measured, marked
    "complete": false)."""
    for size in sizes:
        counts = {r["params"] for r in runs if r["size"] == size}
        if len(counts) > 1:
            sys.exit("gpu_run: size %s: the frameworks' models differ in parameters: %s"
                     % (size, counts))
    rows, managed = summarize(runs, list(sizes))
    ds_lines = [r for r in runs if r["framework"] == "deepspeed"]
    ds_failed = {k: v for k, v in failures.items() if "/deepspeed/" in k}
    ds_unsupported = {k: v for k, v in unsupported.items() if "/deepspeed/" in k}
    if a.no_deepspeed:
        deepspeed = "not run (--no-deepspeed)"
    elif ds_failed or ds_unsupported:
        why = next(iter(ds_failed.values()), None) or next(iter(ds_unsupported.values()))
        deepspeed = "did not run everywhere: " + headline(why)[:500]
    elif ds_lines:
        deepspeed = "ran"
    else:
        deepspeed = "no output"
    result = {
        "command": " ".join(["gpu_run.py"] + argv),
        "started": started,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": time.monotonic() - t_start,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "gpus": gpu_name() if a.device == "cuda" else None},
        "settings": {"device": a.device, "backend": a.backend, "world": a.world,
                     "threads_per_rank": a.threads, "micro_batch": a.micro_batch,
                     "seq": a.block_size, "backwards_per_step": a.backwards,
                     "warmup_windows": a.warmup, "timed_windows": a.windows,
                     "rounds_asked": a.rounds, "rounds_run": len(round_s), "round_s": round_s,
                     "budget_s": a.budget_s, "sizes": sizes, "dtype": "fp32",
                     "optimizer": "AdamW lr=1e-4 weight_decay=0.01",
                     "zerostep_modes": ZEROSTEP_MODES, "deepspeed_modes": DEEPSPEED_MODES,
                     "torch_modes": TORCH_MODES},
        "complete": complete,
        "deepspeed": deepspeed,
        "unsupported": unsupported,
        "failures": failures,
        "summary": rows,
        "managed": managed,
        "runs": runs,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    if a.table:
        with open(a.table, "w") as f:
            f.write(tables(result) + "\n")
    return result


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl on cuda, gloo on cpu")
    p.add_argument("--world", type=int, help="ranks (default: 1 on cuda, one per GPU; 2 on cpu)")
    p.add_argument("--zerostep-bin", help="a prebuilt zerostep_step (--config=cuda for cuda)")
    p.add_argument("--zerostep-lib-path", help="LD_LIBRARY_PATH for zerostep_step alone (the "
                   "pack's LibTorch, NCCL and Debian libraries; the Python sides keep this "
                   "process's, so the pack's older libstdc++ never reaches torch's python)")
    p.add_argument("--python", default=sys.executable, help="the python with torch 2.11")
    p.add_argument("--deepspeed-site", help="a folder to put first on DeepSpeed's PYTHONPATH "
                   "(where the pack's wheels were installed)")
    p.add_argument("--no-deepspeed", action="store_true")
    p.add_argument("--sizes", help="of " + ", ".join(GPU_SIZES))
    p.add_argument("--hf", help="Hugging Face folders (comma-separated) instead of the GPT sizes")
    p.add_argument("--hf-site", help="a folder holding transformers for torch's python (the "
                   "pack's wheels installed there), put first on the Python sides' PYTHONPATH")
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--backwards", type=int, default=4)
    p.add_argument("--threads", type=int, help="host threads per rank (default: 8 on cuda, for "
                   "the offload modes' host AdamW; 1 on cpu)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=240,
                   help="start no round that would end past this (the first always runs)")
    p.add_argument("--launch-timeout-s", type=float, default=300)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: tiny shape, 1 round, 1 window, no warm-up")
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--table", help="write the markdown tables here")
    p.add_argument("--from-json", help="print the tables of an earlier --out; run nothing")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            print(tables(json.load(f)))
        return 0
    if not a.zerostep_bin:
        p.error("--zerostep-bin is required (build //benchmarks/peers:zerostep_step, with "
                "--config=cuda for --device=cuda)")
    a.backend = a.backend or ("nccl" if a.device == "cuda" else "gloo")
    a.world = a.world or (1 if a.device == "cuda" else 2)
    a.threads = a.threads or (min(8, os.cpu_count() or 1) if a.device == "cuda" else 1)
    if a.quick:
        sizes = dict(QUICK_SIZES)
        a.rounds, a.warmup, a.windows, a.block_size, a.micro_batch = 1, 0, 1, 16, 2
    else:
        names = a.sizes.split(",") if a.sizes else list(GPU_SIZES)
        bad = [n for n in names if n not in GPU_SIZES]
        if bad:
            p.error("--sizes: %s not of %s" % (",".join(bad), ", ".join(GPU_SIZES)))
        sizes = {n: GPU_SIZES[n] for n in names}
    if a.hf:
        sizes = {os.path.basename(os.path.normpath(d)): os.path.abspath(d)
                 for d in a.hf.split(",")}
        missing = [d for d in sizes.values() if not os.path.exists(os.path.join(d, "config.json"))]
        if missing:
            p.error("--hf: no config.json in %s (tools/make_hf_model writes such folders)"
                    % ", ".join(missing))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t_start = time.monotonic()

    zs_env = dict(os.environ)
    if a.zerostep_lib_path:
        zs_env["LD_LIBRARY_PATH"] = a.zerostep_lib_path
    py_env = dict(os.environ)
    if a.hf_site:
        py_env["PYTHONPATH"] = a.hf_site + (":" + py_env["PYTHONPATH"]
                                            if py_env.get("PYTHONPATH") else "")
    ds_env = dict(py_env)
    if a.deepspeed_site:
        ds_env["PYTHONPATH"] = a.deepspeed_site + (":" + ds_env["PYTHONPATH"]
                                                   if ds_env.get("PYTHONPATH") else "")
    runs, unsupported, failures = [], {}, {}
    idtmp = tempfile.mkdtemp(prefix="zerostep_gpu_run.")
    round_s = []
    for k in range(a.rounds):
        elapsed = time.monotonic() - t_start
        if k > 0 and elapsed + max(round_s) > a.budget_s:
            log("round %d: not started (%.0f s so far, a round took up to %.0f s, budget %.0f s)"
                % (k + 1, elapsed, max(round_s), a.budget_s))
            break
        t_round = time.monotonic()
        for j, (size, shape) in enumerate(sizes.items()):
            args = shape_args(a, shape)
            jobs = [
                ("zerostep", [a.zerostep_bin, "--modes=" + ",".join(ZEROSTEP_MODES),
                              "--nccl-id-path=%s/nccl.%d.%s.id" % (idtmp, k, size)] + args, a.world),
                ("torch", [a.python, "-W", "ignore", os.path.join(HERE, "torch_step.py"),
                           "--world=%d" % a.world, "--modes=" + ",".join(TORCH_MODES)] + args, None),
            ]
            if not a.no_deepspeed:
                jobs.append(("deepspeed", [a.python, "-W", "ignore", os.path.join(HERE, "deepspeed_step.py"),
                                           "--world=%d" % a.world,
                                           "--modes=" + ",".join(DEEPSPEED_MODES)] + args, None))
            shift = (k + j) % len(jobs)
            for name, cmd, world in jobs[shift:] + jobs[:shift]:
                log("round %d/%d size %s: %s" % (k + 1, a.rounds, size, name))
                t0 = time.monotonic()
                lines, err = run_json(cmd, a.launch_timeout_s, world,
                                      {"zerostep": zs_env, "deepspeed": ds_env,
                                       "torch": py_env}.get(name))
                for line in lines:
                    line.update(round=k, size=size)
                    key = "%s/%s/%s" % (size, line["framework"], line["mode"])
                    if "unsupported" in line:
                        unsupported[key] = line["unsupported"]
                        log("  %-22s not run: %s" % (line["mode"], line["unsupported"].splitlines()[0][:160]))
                        continue
                    runs.append(line)
                    pk = peak(line)
                    log("  %-22s window %.3f s%s" % (line["mode"], line["window_s_median"],
                                                     "  peak %.2f GiB" % (pk / 2**30) if pk else ""))
                if err:
                    failures["%s/%s/round%d" % (size, name, k)] = err
                    log("  %s FAILED (%s)\n%s" % (name, headline(err)[:200], err))
                log("  %s: %.1f s" % (name, time.monotonic() - t0))
                report(a, argv, sizes, runs, unsupported, failures, round_s, started, t_start,
                       complete=False)
        round_s.append(time.monotonic() - t_round)
    result = report(a, argv, sizes, runs, unsupported, failures, round_s, started, t_start,
                    complete=True)
    print(tables(result))
    log("gpu_run: %.1f s, %d round(s), DeepSpeed: %s" % (result["elapsed_s"], len(round_s),
                                                         result["deepspeed"]))
    core_failed = [k for k in failures if "/deepspeed/" not in k]
    return 1 if core_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
