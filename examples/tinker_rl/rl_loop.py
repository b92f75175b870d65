"""An on-policy RL loop on zerostep's trainer server, with the official
tinker SDK: sample, reward, importance-sampling loss, optim_step.

The task is byte-level: after a prompt, the policy (the byte-level tiny GPT
with LoRA adapters, starting from random weights) writes TOKENS bytes; the
reward of a completion is the fraction of its bytes that are lowercase
vowels (a, e, i, o, u). A random model writes one about 2% of the time
(5 bytes of 256); the loop teaches it to write nothing else.

Each step:
  1. save_weights_and_get_sampling_client (the current policy);
  2. sample GROUP completions of each prompt (temperature 1, seed per step);
  3. reward each; advantage = reward - the mean of its prompt's group;
  4. one forward_backward with loss_fn="importance_sampling" (target_tokens,
     the sampler's logprobs, advantages on the completion tokens), then
     optim_step (Adam).

Usage (see README.md next to this file):
  python rl_loop.py --base-url=http://127.0.0.1:8000      # a running server
  python rl_loop.py --server=bazel-bin/tools/trainer_server  # starts its own
Prints the mean reward per step; --plot=FILE.svg plots it, --json=FILE
writes it; --check asserts that it rose (the test, //tools:tinker_rl_test).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import tinker
from tinker import types

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")

PROMPTS = ["vowels: ", "say it: ", "again! ", "more> "]
VOWELS = frozenset(b"aeiou")


def reward(tokens):
    return sum(t in VOWELS for t in tokens) / max(len(tokens), 1)


def resolved(c):
    """SDK 0.38 answers create_lora_training_client and
    save_weights_and_get_sampling_client with a future of the client."""
    return c.result() if hasattr(c, "result") else c


def datum(prompt, completion, sampled_logprobs, advantage):
    """One sequence for importance_sampling: the model reads prompt +
    completion[:-1] and is scored on every next token; only the completion's
    tokens carry an advantage (the prompt's are 0, so they add nothing)."""
    tokens = prompt + completion
    n_prompt = len(prompt) - 1  # targets that are prompt bytes
    logprobs = np.zeros(len(tokens) - 1, dtype=np.float32)
    logprobs[n_prompt:] = sampled_logprobs
    advantages = np.zeros(len(tokens) - 1, dtype=np.float32)
    advantages[n_prompt:] = advantage
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "logprobs": logprobs,
            "advantages": advantages,
        },
    )


def run(base_url, args):
    sc = tinker.ServiceClient(base_url=base_url, api_key=args.api_key)
    tc = resolved(sc.create_lora_training_client(base_model=args.base_model, rank=args.rank,
                                                 seed=args.seed))
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)
    prompts = [list(p.encode()) for p in PROMPTS]
    rewards = []
    for step in range(args.steps):
        t0 = time.time()
        sampler = resolved(tc.save_weights_and_get_sampling_client())
        params = types.SamplingParams(max_tokens=args.tokens, temperature=1.0,
                                      seed=args.seed * 100003 + step)
        futures = [sampler.sample(types.ModelInput.from_ints(p), args.group, params)
                   for p in prompts]
        data, step_rewards = [], []
        for p, fut in zip(prompts, futures):
            seqs = fut.result().sequences
            r = np.array([reward(s.tokens) for s in seqs])
            step_rewards.extend(r)
            adv = r - r.mean()
            for s, a in zip(seqs, adv):
                if a != 0:  # a group-mean sample teaches nothing
                    data.append(datum(p, list(s.tokens), s.logprobs, a))
        if data:
            fb = tc.forward_backward(data, "importance_sampling")
            opt = tc.optim_step(adam)
            fb.result()
            opt.result()
        rewards.append(float(np.mean(step_rewards)))
        print("step %3d  mean reward %.3f  (%d datums, %.2f s)"
              % (step, rewards[-1], len(data), time.time() - t0), flush=True)
    sampler = resolved(tc.save_weights_and_get_sampling_client())
    for text, p in zip(PROMPTS, prompts):
        out = sampler.sample(types.ModelInput.from_ints(p), 1,
                             types.SamplingParams(max_tokens=args.tokens, temperature=1.0,
                                                  seed=args.seed)).result()
        print("after training: %r -> %r"
              % (text, bytes(out.sequences[0].tokens).decode("latin-1")))
    return rewards


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="a running trainer_server, e.g. http://127.0.0.1:8000")
    where.add_argument("--server", help="trainer_server binary to start on a free port")
    ap.add_argument("--server-args", default="--world=1 --stage=0",
                    help="flags for the started server")
    ap.add_argument("--api-key", default="tml-zerostep-local",
                    help="any key starting with tml- (the server does not check it)")
    ap.add_argument("--base-model", default="zerostep/tiny-gpt")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--tokens", type=int, default=8, help="bytes per completion")
    ap.add_argument("--lr", type=float, default=3e-2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", help="write the mean reward per step as SVG (a relative "
                    "path in a Bazel test goes to $TEST_UNDECLARED_OUTPUTS_DIR)")
    ap.add_argument("--json", help="write the rewards and wall time as JSON")
    ap.add_argument("--check", action="store_true",
                    help="fail unless the last steps' mean reward beats the first's by --margin")
    ap.add_argument("--window", type=int, default=5, help="steps averaged by --check")
    ap.add_argument("--margin", type=float, default=0.3)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="with --check: fail if the loop took longer (0: no limit)")
    args = ap.parse_args()
    print("tinker SDK", tinker.__version__, flush=True)

    server = None
    if args.server:
        sys.path.insert(0, os.path.join(TOOLS, "tinker"))
        import local_server  # starts and stops the binary; not part of the SDK loop
        server = local_server.ServerProcess(args.server, *args.server_args.split(), quiet=True)
    t0 = time.time()
    try:
        rewards = run(server.url if server else args.base_url, args)
    finally:
        code = server.stop() if server else 0
    seconds = time.time() - t0
    first = float(np.mean(rewards[:args.window]))
    last = float(np.mean(rewards[-args.window:]))
    print("mean reward: first %d steps %.3f, last %d steps %.3f; %.1f s"
          % (args.window, first, args.window, last, seconds))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rewards": rewards, "seconds": seconds}, f)
    if args.plot:
        if not os.path.isabs(args.plot) and os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR"):
            args.plot = os.path.join(os.environ["TEST_UNDECLARED_OUTPUTS_DIR"], args.plot)
        sys.path.insert(0, TOOLS)
        import plot_svg
        plot_svg.plot([{"name": "mean reward", "points": list(enumerate(rewards))}],
                      "tiny GPT, importance sampling: fraction of vowel bytes",
                      "step", "mean reward", False, False, args.plot)
        print("wrote", args.plot)
    if args.check:
        ok = True
        if last - first < args.margin:
            print("FAIL: reward rose %.3f < margin %.3f" % (last - first, args.margin))
            ok = False
        if args.max_seconds and seconds > args.max_seconds:
            print("FAIL: %.1f s > %.1f s" % (seconds, args.max_seconds))
            ok = False
        if code != 0:
            print("FAIL: the server's exit status after SIGTERM: %r" % code)
            ok = False
        print("PASS" if ok else "FAILED")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
