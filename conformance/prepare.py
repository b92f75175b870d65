#!/usr/bin/env python3
"""Writes a conformance run's shared inputs (conformance/cases.py):

  python prepare.py --dir=RUN --worlds=1,2 [--long]

RUN/cases.json (the quick matrix, or with --long every case), RUN/data.bin
(seeded tokens) and RUN/weights_<dtype>.safetensors (the tiny GPT as
PyTorch initialises it under torch.manual_seed(SEED), in zerostep's names;
rounded to bf16 and fp16 for those dtypes). Needs
torch (the pinned venv).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cases as C  # noqa: E402
import ds_run  # noqa: E402


def quick_cases(worlds):
    """Every stage, dtype and mode at every world, the clip variant (clipping
    and WarmupDecayLR) in fp32 and bf16 and the plain one in fp32 and fp16
    (fp16's loss-scale trajectory is easiest to read without a schedule),
    with DeepSpeed's own optimizer; and fp32 in both variants with
    zerostep's update formula on the DeepSpeed side."""
    out = []
    for v, dtypes in (("plain", ("fp32", "fp16")), ("clip", ("fp32", "bf16"))):
        out += C.make_cases(worlds, dtypes=dtypes, variants=(v,))
    # zerostep's update inside DeepSpeed: fp32, both variants.
    out += C.make_cases(worlds, dtypes=("fp32",), optimizer="formula")
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--worlds", default="1,2")
    p.add_argument("--long", action="store_true", help="every dtype with every variant")
    a = p.parse_args(argv)
    worlds = [int(w) for w in a.worlds.split(",")]
    if max(worlds) > C.WORLD_MAX or min(worlds) < 1:
        p.error("--worlds: each in 1..%d" % C.WORLD_MAX)
    import torch
    os.makedirs(a.dir, exist_ok=True)
    if a.long:
        cases = C.make_cases(worlds) + C.make_cases(worlds, dtypes=("fp32", "bf16"),
                                                    optimizer="formula")
    else:
        cases = quick_cases(worlds)
    with open(os.path.join(a.dir, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    g = torch.Generator().manual_seed(C.SEED)
    data = torch.randint(C.SHAPE["vocab"], (C.MICRO_MAX, C.WORLD_MAX, C.MICRO_BATCH,
                                            C.SHAPE["block_size"] + 1), generator=g,
                         dtype=torch.int64)
    with open(os.path.join(a.dir, "data.bin"), "wb") as f:
        f.write(data.numpy().tobytes())
    torch.manual_seed(C.SEED)
    model = ds_run.build_model()
    formats = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for dtype, low in formats.items():
        C.write_safetensors(os.path.join(a.dir, "weights_%s.safetensors" % dtype),
                            [(ds_run.zerostep_name(n), list(t.shape),
                              t.detach().to(low).float().contiguous().numpy().tobytes())
                             for n, t in model.named_parameters()])
    print("prepare: %d cases, %d parameters" % (
        len(cases), sum(t.numel() for t in model.parameters())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
