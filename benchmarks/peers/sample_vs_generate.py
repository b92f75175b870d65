#!/usr/bin/env python3
"""Sampling tokens/s: the trainer server's sampler (zerostep_sample.cc,
models/sampler.h with the KV cache) against transformers' generate
(hf_generate.py) on the same Hugging Face folder, request and threads, in
one run (docs/benchmarks.md, "Sampling a Hugging Face folder").

  python3 benchmarks/peers/sample_vs_generate.py --preset=20m --threads=2 \\
      --rounds=5 --out=/tmp/sample_vs_generate.json

Makes the folder with //tools:make_hf_model's preset (a Llama), then for
each round runs both sides (the one that goes first alternates), each
loading the folder and timing --calls requests after a warm-up; a side's
time in a round is the median of its calls. Per round the ratio is
transformers' time / zerostep's (both generate samples * max_tokens
tokens: > 1 means zerostep's tokens/s is higher); the JSON holds every
call, the ratios' median and range, and zerostep's memory figures. The
transformers side runs in models/hf_py_requirements.txt's environment
(torch 2.11.0, transformers 5.24.0); zerostep is the default build
(Debian's LibTorch) unless --zerostep-bin names another.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as peers  # noqa: E402


def median_ms(lines):
    return statistics.median(l["ms"] for l in lines if "ms" in l)


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="20m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--out", default="/tmp/sample_vs_generate.json")
    p.add_argument("--dir", default="/tmp/zerostep-sample-vs-generate")
    p.add_argument("--zerostep-bin", help="prebuilt //benchmarks/peers:zerostep_sample")
    p.add_argument("--make-hf-model-bin", help="prebuilt //tools:make_hf_model")
    a = p.parse_args(argv)
    zbin = a.zerostep_bin
    if zbin is None:
        bazelw = os.path.join(peers.ROOT, "bazelw")
        subprocess.run([bazelw, "build", "--jobs=2", "//benchmarks/peers:zerostep_sample"],
                       cwd=peers.ROOT, check=True, stdout=sys.stderr)
        bin_dir = subprocess.run([bazelw, "info", "bazel-bin"], cwd=peers.ROOT, check=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True).stdout.strip()
        zbin = os.path.join(bin_dir, "benchmarks/peers/zerostep_sample")
    folder = peers.make_hf_folders([a.preset], a.dir, a.make_hf_model_bin)["llama-" + a.preset]
    hf_python = peers.hf_python()
    common = ["--hf=" + folder, "--threads=%d" % a.threads, "--prompt=%d" % a.prompt,
              "--max-tokens=%d" % a.max_tokens, "--samples=%d" % a.samples,
              "--calls=%d" % a.calls, "--warmup=1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TRANSFORMERS_VERBOSITY="error")
    sides = {
        "zerostep": [zbin] + common,
        "transformers": [hf_python, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "hf_generate.py")] + common,
    }
    rounds = []
    for r in range(a.rounds):
        order = ["zerostep", "transformers"] if r % 2 == 0 else ["transformers", "zerostep"]
        got = {}
        for side in order:
            got[side] = peers.json_lines(sides[side], env=env)
            peers.log("round %d %s: median %.1f ms" % (r, side, median_ms(got[side])))
        rounds.append({
            "order": order, "calls": got,
            "ratio_transformers_over_zerostep": median_ms(got["transformers"]) /
                                                median_ms(got["zerostep"]),
        })
    ratios = [r["ratio_transformers_over_zerostep"] for r in rounds]
    tokens = a.samples * a.max_tokens
    summary = next(l["summary"] for l in rounds[-1]["calls"]["zerostep"] if "summary" in l)
    zs_ms = statistics.median(median_ms(r["calls"]["zerostep"]) for r in rounds)
    hf_ms = statistics.median(median_ms(r["calls"]["transformers"]) for r in rounds)
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu": peers.cpu_model(),
        "load_average": os.getloadavg(),
        "preset": a.preset, "threads": a.threads, "prompt": a.prompt,
        "max_tokens": a.max_tokens, "samples": a.samples, "calls": a.calls,
        "tokens_per_call": tokens,
        "zerostep_tokens_per_s": tokens / (zs_ms / 1e3),
        "transformers_tokens_per_s": tokens / (hf_ms / 1e3),
        "ratio": peers.spread(ratios),
        "zerostep_memory": summary,
        "rounds": rounds,
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("preset %s, %d threads, %d samples x %d tokens after a %d-token prompt (%s)" %
          (a.preset, a.threads, a.samples, a.max_tokens, a.prompt, result["cpu"]))
    print("zerostep %.1f tokens/s, transformers generate %.1f tokens/s; "
          "zerostep / transformers tokens/s: median %.2f (rounds %.2f-%.2f)" %
          (result["zerostep_tokens_per_s"], result["transformers_tokens_per_s"],
           result["ratio"]["median"], result["ratio"]["min"], result["ratio"]["max"]))
    print("zerostep memory: %s" % json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
