#!/usr/bin/env python3
"""zerostep against PyTorch DDP and FSDP2, on the same GPT shapes (docs/benchmarks.md).

  python3 benchmarks/peers/run.py --out=/tmp/peers.json --svg=docs/peers.svg

Builds //benchmarks/peers:zerostep_step and //tools:launch, finds the pinned
PyPI torch (third_party/libtorch/setup.sh 2.11.0, which installs it on first
use), then for each round and size runs, interleaved A/B (the framework that
goes first alternates between rounds, and the order of the modes inside a
launch rotates):
  zerostep  tools/launch --nproc=W zerostep_step, Gloo, ZeRO stages 0-3
            (DeepSpeed semantics) and stage2_once, stage3_once
            (zero_optimization.reduce_once_per_step), stage2_overlap
            (overlap_comm), stage0_overlap and stage2_once_overlap
            (managed, overlap_comm: the all-reduce, or the reduce-scatter,
            inside the last backward, as DDP's all-reduce), stage3_gather
            and stage3_once_gather (zero_optimization.gather_once_per_step:
            each block gathered once per window, as FSDP2 with
            reshard_after_backward=False); on request stage3_overlap and
            stage3_gather_overlap (overlap_comm: each block's
            reduce-scatter in flight while autograd goes on)
  torch     torch_step.py, W gloo processes, ddp (no_sync) and fsdp2
            (fully_shard per block, set_requires_gradient_sync)
  deepspeed only with --deepspeed-site: deepspeed_step.py (DeepSpeed
            0.19.8 on its CPU accelerator, W gloo processes), ZeRO stages
            0-3 with managed_gradient_accumulation false, the peer of
            zerostep's stage0-stage3 rows (the same semantics); the three
            frameworks' order rotates from round to round
Every launch also times plain forward+backward (no engine, no wrapper) in its
framework. A run's time is the median of its timed windows; per (size, mode)
the JSON (--out) holds every run and the medians and ranges over rounds of
the paired ratios peer time / zerostep time (peer = ddp, fsdp2, and the
faster of the two in that round; DeepSpeed's stage k against zerostep's
stagek, apart). Progress goes to stderr, the tables to stdout; --svg draws
the ratio against the faster peer per stage and size.
--quick: tiny shapes, one round, one window (a smoke run, not a measurement).
--hf=PRESET[,PRESET]: instead of the GPT, a Llama-shaped Hugging Face folder
of //tools:make_hf_model's preset (tiny, 20m, 125m, 350m), loaded by zerostep
(models/hf_decoder.h) and by transformers on the torch side (in the pinned
environment of models/hf_py_requirements.txt, which sees torch); at
--world=1 the torch side also runs "eager" (the model and its AdamW, no
wrapper), and the tables add the ratio eager / zerostep.
W is --world (default 2); --threads compute threads per rank on both sides.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_VERSION = "2.11.0"

# name: (vocab, d_model, n_layer, n_head). Every size uses --block-size,
# --micro-batch and --backwards.
SIZES = {
    "1M": (4096, 96, 3, 3),
    "7M": (4096, 256, 6, 4),
    "26M": (4096, 512, 7, 8),
}
QUICK_SIZES = {"tiny": (64, 32, 2, 2)}
ZEROSTEP_MODES = ["stage0", "stage1", "stage2", "stage3", "stage2_once", "stage3_once",
                  "stage0_overlap", "stage2_overlap", "stage2_once_overlap",
                  "stage3_gather", "stage3_once_gather"]
# Not run by default: stage 3 with stage3_max_reuse_distance 0 (every block
# gathered again for its backward), against stage3's DeepSpeed default; and
# stage 3 with overlap_comm (each block's reduce-scatter in flight while
# autograd goes on: Note [Stage 3 reduce-scatter in flight] in
# zero/stage3.h), alone and with gather_once_per_step.
EXTRA_ZEROSTEP_MODES = ["stage3_release", "stage3_overlap", "stage3_gather_overlap"]
TORCH_MODES = ["ddp", "fsdp2"]
# DeepSpeed's modes, each the peer of the zerostep mode of the same name.
DEEPSPEED_MODES = ["stage0", "stage1", "stage2", "stage3"]
DEEPSPEED_VERSION = "0.19.8"


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def torch_python(install):
    """The pinned torch venv's python, found as setup.sh's fast path finds
    its LibTorch link; with `install`, setup.sh makes it when missing. None
    when it is absent and not to be installed."""
    caches = ["/var/cache/zerostep",
              os.path.join(os.environ.get("XDG_CACHE_HOME") or
                           os.path.join(os.environ.get("HOME", "/tmp"), ".cache"), "zerostep")]
    links = [os.path.join(c, "libtorch-" + TORCH_VERSION) for c in caches]
    if install and not any(os.path.isdir(l) for l in links):
        out = subprocess.run([os.path.join(ROOT, "third_party/libtorch/setup.sh"), TORCH_VERSION],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        links = [out.strip()]
    for link in links:
        # <venv>/lib/python3.X/site-packages/torch
        venv = os.path.realpath(link)
        for _ in range(4):
            venv = os.path.dirname(venv)
        python = os.path.join(venv, "bin", "python")
        if os.path.isdir(link) and os.path.exists(python):
            return python
    return None


def hf_python():
    """The python of models/hf_py_requirements.txt's environment, which sees
    the pinned torch (common/pinned_venv.sh; made on first use)."""
    torch_dir = subprocess.run([os.path.join(ROOT, "third_party/libtorch/setup.sh"), TORCH_VERSION],
                               check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    site = os.path.dirname(os.path.realpath(torch_dir))
    venv = subprocess.run([os.path.join(ROOT, "common/pinned_venv.sh"), "hf-venv",
                           os.path.join(ROOT, "models/hf_py_requirements.txt"),
                           "import transformers, peft, torch", site],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return os.path.join(venv, "bin", "python")


def make_hf_folders(presets, out_dir, make_bin=None):
    """//tools:make_hf_model's folder of each preset under out_dir (built
    here unless make_bin is given)."""
    if make_bin is None:
        bazelw = os.path.join(ROOT, "bazelw")
        subprocess.run([bazelw, "build", "--jobs=2", "//tools:make_hf_model"], cwd=ROOT,
                       check=True, stdout=sys.stderr)
        bin_dir = subprocess.run([bazelw, "info", "bazel-bin"], cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True).stdout.strip()
        make_bin = os.path.join(bin_dir, "tools/make_hf_model")
    folders = {}
    for preset in presets:
        folder = os.path.join(out_dir, "llama-" + preset)
        subprocess.run([make_bin, "--out=" + folder,
                        "--preset=" + preset], check=True, stdout=sys.stderr)
        folders["llama-" + preset] = folder
    return folders


def build(libtorch):
    """Builds zerostep against `libtorch`: "torch" is the peer's own LibTorch
    (PyPI torch 2.11, the --config=cuda build, which runs on the CPU here
    too), "debian" Debian's 1.13.1 (the default build)."""
    config = ["--config=cuda"] if libtorch == "torch" else []
    log("building //benchmarks/peers:zerostep_step //tools:launch", *config)
    bazelw = os.path.join(ROOT, "bazelw")
    subprocess.run([bazelw, "build", "--jobs=2"] + config +
                   ["//benchmarks/peers:zerostep_step", "//tools:launch"],
                   cwd=ROOT, check=True, stdout=sys.stderr)
    bin_dir = subprocess.run([bazelw, "info"] + config + ["bazel-bin"], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout.strip()
    return (os.path.join(bin_dir, "benchmarks/peers/zerostep_step"),
            os.path.join(bin_dir, "tools/launch"))


def model_args(shape):
    """The step programs' model flags: a GPT shape (vocab, d_model,
    n_layer, n_head), or a Hugging Face folder's path."""
    if isinstance(shape, str):
        return ["--hf=" + shape]
    vocab, d, layers, heads = shape
    return ["--vocab=%d" % vocab, "--d-model=%d" % d, "--n-layer=%d" % layers,
            "--n-head=%d" % heads]


def shape_args(a, shape):
    return model_args(shape) + ["--block-size=%d" % a.block_size,
            "--micro-batch=%d" % a.micro_batch, "--backwards=%d" % a.backwards,
            "--threads=%d" % a.threads, "--warmup=%d" % a.warmup,
            "--windows=%d" % a.windows]


def json_lines(cmd, env=None):
    """Runs cmd (in env, default ours); the JSON objects it printed (rank
    prefixes stripped)."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit("peers: %s exited %d:\n%s%s" % (" ".join(cmd), p.returncode,
                                                  p.stdout[-3000:], p.stderr[-3000:]))
    out = []
    for line in p.stdout.splitlines():
        brace = line.find("{")
        if brace >= 0:
            out.append(json.loads(line[brace:]))
    return out


def rotate(modes, k):
    k %= len(modes)
    return modes[k:] + modes[:k]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs, sizes, zmodes):
    """Per (size, zerostep mode): times and paired ratios over rounds."""
    rows = []
    for size in sizes:
        by, ds = {}, {}
        for r in runs:
            if r["size"] == size:
                into = ds if r["framework"] == "deepspeed" else by
                into.setdefault(r["mode"], {})[r["round"]] = r
        rounds = sorted(by["ddp"])
        fz = [by[zmodes[0]][k]["fwdbwd_s_median"] for k in rounds]
        ft = [by["ddp"][k]["fwdbwd_s_median"] for k in rounds]
        for mode in zmodes:
            z = [by[mode][k]["window_s_median"] for k in rounds]
            ddp = [by["ddp"][k]["window_s_median"] for k in rounds]
            fsdp = [by["fsdp2"][k]["window_s_median"] for k in rounds]
            best = [min(x, y) for x, y in zip(ddp, fsdp)]
            if "eager" in by:
                eager = [by["eager"][k]["window_s_median"] for k in rounds]
            rows.append({
                "size": size, "params": by[mode][rounds[0]]["params"], "mode": mode,
                "rounds": len(rounds),
                "zerostep_s": spread(z), "ddp_s": spread(ddp), "fsdp2_s": spread(fsdp),
                "ratio_ddp": spread([p / q for p, q in zip(ddp, z)]),
                "ratio_fsdp2": spread([p / q for p, q in zip(fsdp, z)]),
                "ratio_faster_peer": spread([p / q for p, q in zip(best, z)]),
                # Plain forward+backward of N micro-batches, no engine: the
                # frameworks' compute alone (torch / zerostep's LibTorch).
                "fwdbwd_zerostep_s": spread(fz), "fwdbwd_torch_s": spread(ft),
                "ratio_fwdbwd": spread([p / q for p, q in zip(ft, fz)]),
                # What the engine or wrapper adds to a window beyond that.
                "overhead_zerostep_s": spread([w - f for w, f in zip(z, fz)]),
                "overhead_faster_peer_s": spread([w - f for w, f in zip(best, ft)]),
            })
            if "eager" in by:
                rows[-1]["eager_s"] = spread(eager)
                rows[-1]["ratio_eager"] = spread([p / q for p, q in zip(eager, z)])
            if mode in ds:
                # DeepSpeed at the same stage, the same semantics.
                d = [ds[mode][k]["window_s_median"] for k in rounds]
                rows[-1]["deepspeed_s"] = spread(d)
                rows[-1]["ratio_deepspeed"] = spread([p / q for p, q in zip(d, z)])
            # A window's forward / backward / step parts (medians over rounds).
            for name, runs_of in (("zerostep", by[mode]), ("ddp", by["ddp"]), ("fsdp2", by["fsdp2"]),
                                  ("eager", by.get("eager"))):
                if runs_of is None:
                    continue
                if "step_s_median" in runs_of[rounds[0]]:
                    rows[-1]["phases_" + name + "_s"] = {
                        phase: statistics.median(runs_of[k][phase + "_s_median"] for k in rounds)
                        for phase in ("forward", "backward", "step")}
    return rows


def table(rows):
    out = ["| size (params) | zerostep mode | zerostep s | DDP s | FSDP2 s | **faster peer / zerostep** (range) "
           "| DDP / zs | FSDP2 / zs | fwd+bwd torch / zs | overhead zs s | overhead peer s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = r["ratio_faster_peer"]
        out.append("| %s (%s) | %s | %.3f | %.3f | %.3f | **%.2f** (%.2f-%.2f) | %.2f | %.2f | %.2f | %.3f | %.3f |" % (
            r["size"], format(r["params"], ","), r["mode"], r["zerostep_s"]["median"],
            r["ddp_s"]["median"], r["fsdp2_s"]["median"], f["median"], f["min"], f["max"],
            r["ratio_ddp"]["median"], r["ratio_fsdp2"]["median"], r["ratio_fwdbwd"]["median"],
            r["overhead_zerostep_s"]["median"], r["overhead_faster_peer_s"]["median"]))
    return "\n".join(out)


def eager_table(rows):
    """zerostep against the model alone in PyTorch eager (--hf at one rank)."""
    out = ["| model (params) | zerostep mode | zerostep s | eager s | **eager / zerostep** (range) "
           "| zs fwd / bwd / step s | eager fwd / bwd / step s |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    cell = lambda p: "%.3f / %.3f / %.3f" % (p["forward"], p["backward"], p["step"])
    for r in rows:
        if "ratio_eager" in r:
            e = r["ratio_eager"]
            out.append("| %s (%s) | %s | %.3f | %.3f | **%.2f** (%.2f-%.2f) | %s | %s |" % (
                r["size"], format(r["params"], ","), r["mode"], r["zerostep_s"]["median"],
                r["eager_s"]["median"], e["median"], e["min"], e["max"],
                cell(r["phases_zerostep_s"]), cell(r["phases_eager_s"])))
    return "\n".join(out) if len(out) > 2 else ""


def deepspeed_table(rows):
    """zerostep's stage k against DeepSpeed's, where DeepSpeed ran."""
    out = ["| size (params) | mode | zerostep s | DeepSpeed s | **DeepSpeed / zerostep** (range) |",
           "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if "ratio_deepspeed" in r:
            d = r["ratio_deepspeed"]
            out.append("| %s (%s) | %s | %.3f | %.3f | **%.2f** (%.2f-%.2f) |" % (
                r["size"], format(r["params"], ","), r["mode"], r["zerostep_s"]["median"],
                r["deepspeed_s"]["median"], d["median"], d["min"], d["max"]))
    return "\n".join(out) if len(out) > 2 else ""


def phase_table(rows):
    """Forward / backward / step seconds per window, where the runs timed them."""
    out = ["| size | zerostep mode | zerostep fwd / bwd / step s | DDP fwd / bwd / step s | FSDP2 fwd / bwd / step s |",
           "| --- | --- | --- | --- | --- |"]
    cell = lambda p: "%.3f / %.3f / %.3f" % (p["forward"], p["backward"], p["step"])
    for r in rows:
        if "phases_zerostep_s" in r:
            out.append("| %s | %s | %s | %s | %s |" % (
                r["size"], r["mode"], cell(r["phases_zerostep_s"]), cell(r["phases_ddp_s"]),
                cell(r["phases_fsdp2_s"])))
    return "\n".join(out) if len(out) > 2 else ""


def svg(rows, path, world):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import plot_svg
    series = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        series.append({"name": mode, "dash": not mode[-1].isdigit(),
                       "points": [(r["params"], r["ratio_faster_peer"]["median"])
                                  for r in rows if r["mode"] == mode]})
    first = [r for r in rows if r["mode"] == rows[0]["mode"]]
    series.append({"name": "fwd+bwd alone", "color": "black", "width": 1, "dash": True,
                   "points": [(r["params"], r["ratio_fwdbwd"]["median"]) for r in first]})
    series.append({"name": "parity (1.0)", "color": "#999", "width": 1,
                   "points": [(first[0]["params"], 1.0), (first[-1]["params"], 1.0)]})
    plot_svg.plot(series, "faster peer (DDP or FSDP2) time / zerostep time, %d Gloo rank%s"
                  % (world, "" if world == 1 else "s"),
                  "parameters", "peer / zerostep (higher: zerostep faster)", True, False, path)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--svg", help="draw the ratio plot here")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default=",".join(SIZES), help="of " + ", ".join(SIZES))
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--backwards", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--world", type=int, default=2, help="ranks (processes) per side")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--no-once", action="store_true", help="skip the modes with _once")
    p.add_argument("--zerostep-modes", default=",".join(ZEROSTEP_MODES),
                   help="zerostep's modes, of " +
                   ", ".join(ZEROSTEP_MODES + EXTRA_ZEROSTEP_MODES))
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny shapes, 1 round, 1 window")
    p.add_argument("--libtorch", choices=["torch", "debian"], default="torch",
                   help="the LibTorch zerostep is built against: the peer's own (PyPI torch "
                        "%s, --config=cuda; default, so both sides compute with the same "
                        "library) or Debian's 1.13.1" % TORCH_VERSION)
    p.add_argument("--zerostep-bin", help="prebuilt zerostep_step (with --launch-bin: no build)")
    p.add_argument("--launch-bin")
    p.add_argument("--zerostep-lib-path",
                   help="LD_LIBRARY_PATH for the zerostep launch alone (a prebuilt pack run against "
                        "another LibTorch; torch's python keeps ours)")
    p.add_argument("--python", help="torch's python (default: the pinned venv)")
    p.add_argument("--deepspeed-site",
                   help="also run DeepSpeed %s: a folder put first on its PYTHONPATH that "
                        "holds DeepSpeed and its needs for torch's python (pip install "
                        "--target; docs/benchmarks.md says how). Without it DeepSpeed is not "
                        "run" % DEEPSPEED_VERSION)
    p.add_argument("--deepspeed-modes", default=",".join(DEEPSPEED_MODES),
                   help="DeepSpeed's modes, of " + ", ".join(DEEPSPEED_MODES))
    p.add_argument("--skip-without-torch", action="store_true",
                   help="exit 0 with a SKIPPED line when the pinned venv is absent (no install)")
    p.add_argument("--from-json", help="print the table (and --svg) of an earlier --out; run nothing")
    p.add_argument("--hf", help="Llama-shaped Hugging Face folders of these make_hf_model presets "
                   "(tiny, 20m, 125m, 350m) instead of the GPT sizes")
    p.add_argument("--hf-dir", default="/tmp/zerostep_peers_hf",
                   help="where --hf's folders are written")
    p.add_argument("--make-hf-model-bin", help="prebuilt //tools:make_hf_model (no build)")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            old = json.load(f)
        report(old["summary"], a.svg, old["settings"]["world"])
        return 0
    if min(a.world, a.threads, a.rounds) < 1:
        p.error("--world, --threads and --rounds must be >= 1")
    sizes = dict(QUICK_SIZES) if a.quick else {s: SIZES[s] for s in a.sizes.split(",")}
    if a.quick:
        a.rounds, a.warmup, a.windows, a.block_size = 1, 0, 1, 16
    torch_modes = list(TORCH_MODES)
    if a.hf:
        sizes = make_hf_folders(a.hf.split(","), a.hf_dir, a.make_hf_model_bin)
        if a.world == 1:
            torch_modes.append("eager")
    python = a.python or (hf_python() if a.hf else torch_python(install=not a.skip_without_torch))
    if python is None:
        print("SKIPPED: the pinned torch %s venv is absent; `third_party/libtorch/setup.sh %s` "
              "installs it (about 4.5 GB from PyPI)" % (TORCH_VERSION, TORCH_VERSION))
        return 0
    zbin, launch = (a.zerostep_bin, a.launch_bin) if a.zerostep_bin else build(a.libtorch)
    zmodes = a.zerostep_modes.split(",")
    unknown = set(zmodes) - set(ZEROSTEP_MODES + EXTRA_ZEROSTEP_MODES)
    if unknown:
        p.error("--zerostep-modes: unknown %s" % sorted(unknown))
    zmodes = [m for m in zmodes if not (a.no_once and "_once" in m)]
    dmodes = a.deepspeed_modes.split(",") if a.deepspeed_site else []
    if set(dmodes) - set(DEEPSPEED_MODES):
        p.error("--deepspeed-modes: unknown %s" % sorted(set(dmodes) - set(DEEPSPEED_MODES)))
    if a.deepspeed_site and not os.path.isdir(os.path.join(a.deepspeed_site, "deepspeed")):
        p.error("--deepspeed-site=%s holds no deepspeed package. Fix: pip install --target "
                "there DeepSpeed %s and its needs (docs/benchmarks.md)"
                % (a.deepspeed_site, DEEPSPEED_VERSION))
    env_cmd = " ".join(["benchmarks/peers/run.py"] + argv)
    zs_env = None
    if a.zerostep_lib_path:
        zs_env = dict(os.environ, LD_LIBRARY_PATH=a.zerostep_lib_path)
    ds_env = None
    if a.deepspeed_site:
        ds_env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=a.deepspeed_site + (
            ":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    envs = {"zerostep": zs_env, "torch": None, "deepspeed": ds_env}

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs = []
    for k in range(a.rounds):
        for size, shape in sizes.items():
            args = shape_args(a, shape)
            z = [launch, "--nproc=%d" % a.world, "--", zbin, "--modes=" + ",".join(rotate(zmodes, k))] + args
            t = [python, "-W", "ignore", os.path.join(HERE, "torch_step.py"),
                 "--modes=" + ",".join(rotate(torch_modes, k)), "--world=%d" % a.world] + args
            launches = [("zerostep", z), ("torch", t)]
            if dmodes:
                launches.append(("deepspeed", [
                    python, "-W", "ignore", os.path.join(HERE, "deepspeed_step.py"),
                    "--modes=" + ",".join(rotate(dmodes, k)), "--world=%d" % a.world,
                    "--device=cpu"] + args))
            # Who goes first rotates (with two frameworks: alternates).
            for name, cmd in rotate(launches, k):
                log("round %d/%d size %s: %s" % (k + 1, a.rounds, size, name))
                for line in json_lines(cmd, envs[name]):
                    if "unsupported" in line:
                        sys.exit("peers: %s refused mode %s: %s" % (
                            name, line["mode"], line["unsupported"]))
                    line.update(round=k, size=size)
                    runs.append(line)
                    log("  %-12s window %.3f s  fwd+bwd %.3f s" % (
                        line["mode"], line["window_s_median"], line["fwdbwd_s_median"]))
    for size in sizes:
        counts = {r["params"] for r in runs if r["size"] == size}
        if len(counts) != 1:
            sys.exit("peers: size %s: the frameworks' models differ in parameters: %s" % (size, counts))
    rows = summarize(runs, list(sizes), zmodes)
    result = {
        "command": env_cmd,
        "started": started,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "settings": {"world": a.world, "threads_per_rank": a.threads, "micro_batch": a.micro_batch,
                     "seq": a.block_size, "backwards_per_window": a.backwards,
                     "warmup_windows": a.warmup, "timed_windows": a.windows, "rounds": a.rounds,
                     "sizes": sizes, "optimizer": "AdamW lr=1e-4 weight_decay=0.01",
                     "torch": TORCH_VERSION,
                     "deepspeed": (DEEPSPEED_VERSION + " (CPU accelerator), " + ",".join(dmodes)
                                   if dmodes else "not run (no --deepspeed-site)"),
                     "zerostep_libtorch": ("prebuilt" if a.zerostep_bin else
                                           "PyPI torch " + TORCH_VERSION if a.libtorch == "torch"
                                           else "Debian 1.13.1")},
        "summary": rows,
        "runs": runs,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    report(rows, a.svg, a.world)
    return 0


def report(rows, svg_path, world):
    """The tables on stdout, and the plot where asked for."""
    if svg_path:
        svg(rows, svg_path, world)
    print(table(rows))
    phases = phase_table(rows)
    if phases:
        print("\n" + phases)
    against_eager = eager_table(rows)
    if against_eager:
        print("\n" + against_eager)
    against_ds = deepspeed_table(rows)
    if against_ds:
        print("\n" + against_ds)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
