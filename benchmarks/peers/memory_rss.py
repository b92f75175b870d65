#!/usr/bin/env python3
"""Resident memory per rank against the engine's plan, ZeRO stages 0-3
(docs/benchmarks.md "Memory per rank"; issue 46).

  python3 benchmarks/peers/memory_rss.py --out=/tmp/rss.json

For each world (--worlds, default 2,4) and stage 0-3, one launch of
tools/launch --nproc=W zerostep_step --modes=stageK (Gloo processes,
DeepSpeed's semantics: N backward() calls then step(), AdamW, fp32), on the
GPT of --vocab/--d-model/--n-layer/--n-head, or a Hugging Face folder
(--hf=DIR, made by tools/make_hf_model; --load=meta builds each rank's
decoder on the meta device and reads only its elements from the folder).
zerostep_step reports on
every rank (Note [Resident memory per mode] in zerostep_step.cc) the
resident set before the model is made, its peak while the model and the
Engine are made, the resident set once made, and its peak over the
windows. The table gives, per stage and world, the largest over ranks of
  rest     at_rest - baseline: the model states the rank keeps
  peak     training_peak - baseline
  made     construction_peak - baseline (the model built whole by the
           caller at every stage: stage 3 releases it at construction)
against the engine's plan (Engine::memory(): its at-rest and peak bytes,
equal to planned_memory(), Note [Memory plan] in zero/schedule.h), in MB
(10^6 bytes). What peak holds beyond the plan is the activations of one
micro-batch, autograd's gradients before they are bucketed, Gloo's
buffers and the allocator's rounding.
Buckets are --bucket-elements (default 2M elements, 8 MB): at DeepSpeed's
defaults (5e8 elements) every bucket of a model this size is the whole
model, and the buffers the plan names outweigh what partitioning saves.
--check fails (exit 1) unless the training peak falls stage by stage
(stage 0 > 1 > 2 > 3) at every world.
--stage3-mode=release measures stage 3 with stage3_max_reuse_distance 0
(zerostep_step --modes=stage3_release): DeepSpeed's default (1e9) keeps
every block of a model this small gathered from its forward to its
backward, the whole model's parameters (4 bytes per parameter), which
stage 2's replica costs too; the table's stage column then says "3r".
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (the peers' build and launch helpers)


def measure(zbin, launch, world, stage, a):
    model = (["--hf=%s" % a.hf, "--load=%s" % a.load] if a.hf else
             ["--vocab=%d" % a.vocab, "--d-model=%d" % a.d_model, "--n-layer=%d" % a.n_layer,
              "--n-head=%d" % a.n_head])
    mode = "stage%d" % stage + ("_release" if stage == 3 and a.stage3_mode == "release" else "")
    cmd = [launch, "--nproc=%d" % world, "--", zbin, "--modes=%s" % mode, "--rss"] + model + [
           "--block-size=%d" % a.block_size, "--bucket-elements=%d" % a.bucket_elements,
           "--micro-batch=%d" % a.micro_batch, "--backwards=%d" % a.backwards,
           "--threads=1", "--warmup=0", "--windows=%d" % a.windows]
    lines = [x for x in run.json_lines(cmd) if x.get("mode") == mode]
    if len(lines) != 1 or "rss_kib" not in lines[0]:
        sys.exit("memory_rss: %s printed no %s line with rss_kib" % (" ".join(cmd), mode))
    line = lines[0]
    e = line["memory"]["engine_bytes"]
    ranks = line["rss_kib"]
    kb = 1024 / 1e6  # KiB to MB

    def worst(f):
        return max(f(r) for r in ranks) * kb

    return {
        "world": world, "stage": stage, "mode": mode, "params": line["params"],
        "plan_rest_mb": (e["param"] + e["grad"] + e["optimizer_state"] + e["rollback"]) / 1e6,
        "plan_peak_mb": e["peak"] / 1e6,
        "rest_mb": worst(lambda r: r["at_rest"] - r["baseline"]),
        "peak_mb": worst(lambda r: r["training_peak"] - r["baseline"]),
        "made_mb": worst(lambda r: r["construction_peak"] - r["baseline"]),
        "baseline_mb": worst(lambda r: r["baseline"]),
        "rss_kib": ranks,
        "engine_bytes": e,
    }


def table(rows):
    out = ["| world | stage | plan at rest | RSS at rest | plan peak | RSS peak | RSS peak - plan "
           "| RSS while made | baseline |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append("| %d | %s | %.1f | %.1f | %.1f | %.1f | %+.1f | %.1f | %.1f |" % (
            r["world"], "3r" if r["mode"] == "stage3_release" else str(r["stage"]),
            r["plan_rest_mb"], r["rest_mb"], r["plan_peak_mb"],
            r["peak_mb"], r["peak_mb"] - r["plan_peak_mb"], r["made_mb"], r["baseline_mb"]))
    return "\n".join(out)


def falls(rows):
    """The worlds where the training peak does not fall stage by stage."""
    bad = []
    for w in sorted({r["world"] for r in rows}):
        peaks = [r["peak_mb"] for r in sorted(rows, key=lambda r: r["stage"]) if r["world"] == w]
        if any(a <= b for a, b in zip(peaks, peaks[1:])):
            bad.append((w, peaks))
    return bad


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--hf", help="a Hugging Face folder (tools/make_hf_model) instead of the GPT")
    p.add_argument("--load", default="whole", choices=["whole", "meta"],
                   help="with --hf: each rank loads the whole folder, or builds on the meta "
                   "device and reads its own elements (stage 3: never the whole model)")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--bucket-elements", type=int, default=1 << 21,
                   help="reduce, allgather and prefetch bucket sizes (elements; default 2M = 8 MB: "
                   "DeepSpeed's 5e8 defaults make every bucket the whole model here)")
    p.add_argument("--backwards", type=int, default=4)
    p.add_argument("--stage3-mode", default="default", choices=["default", "release"],
                   help="release: stage 3 with stage3_max_reuse_distance 0 (see above)")
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--zerostep-bin", help="prebuilt zerostep_step (with --launch-bin: no build)")
    p.add_argument("--launch-bin")
    p.add_argument("--out", help="JSON of every run")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless the peak falls stage by stage at every world")
    a = p.parse_args(argv)
    zbin, launch = (a.zerostep_bin, a.launch_bin) if a.zerostep_bin else run.build("debian")
    rows = []
    for w in [int(x) for x in a.worlds.split(",")]:
        for s in [int(x) for x in a.stages.split(",")]:
            run.log("world %d stage %d" % (w, s))
            rows.append(measure(zbin, launch, w, s, a))
    what = ("Hugging Face folder %s (load %s)" % (a.hf, a.load)) if a.hf else "GPT"
    print("%s; %s of %d parameters, micro-batch %d x %d tokens, N = %d, fp32, AdamW; "
          "MB = 10^6 bytes" % (run.cpu_model(), what, rows[0]["params"], a.micro_batch,
                               a.block_size, a.backwards))
    print(table(rows))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": run.cpu_model(), "settings": vars(a), "rows": rows}, f, indent=1)
    bad = falls(rows)
    for w, peaks in bad:
        print("memory_rss: at world %d the peak does not fall stage by stage: %s" %
              (w, ", ".join("%.1f" % x for x in peaks)))
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
