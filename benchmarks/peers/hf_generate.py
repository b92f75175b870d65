"""The transformers side of sample_vs_generate.py: model.generate with its
KV cache on the same folder, threads and request as zerostep_sample.cc.

    python hf_generate.py --hf=DIR --threads=2 --prompt=16 --max-tokens=64
                          --samples=4 --calls=3 --warmup=1

AutoModelForCausalLM.from_pretrained(DIR) in float32 with transformers'
default attention (sdpa, what a user runs), torch.set_num_threads(threads);
each call is generate(prompt, do_sample=True, temperature=1, top_k=0,
top_p=1, num_return_sequences=samples, max_new_tokens=min_new_tokens=
max_tokens) under torch.inference_mode(), so it generates samples *
max_tokens tokens, as zerostep_sample does. Prints one JSON line per timed
call {"ms", "tokens"}.
"""

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True)
    for k, d in [("threads", 1), ("prompt", 16), ("max-tokens", 64), ("samples", 4),
                 ("calls", 3), ("warmup", 1)]:
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.hf, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    ids = torch.tensor([[(1 + 7 * i) % vocab for i in range(a.prompt)]])
    for i in range(a.warmup + a.calls):
        torch.manual_seed(i)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0,
                                 num_return_sequences=a.samples, max_new_tokens=a.max_tokens,
                                 min_new_tokens=a.max_tokens, eos_token_id=None,
                                 pad_token_id=0, use_cache=True)
        ms = (time.perf_counter() - start) * 1e3
        if i >= a.warmup:
            print(json.dumps({"ms": ms, "tokens": int((out.shape[1] - a.prompt) * out.shape[0])}),
                  flush=True)


if __name__ == "__main__":
    main()
