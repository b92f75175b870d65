#!/usr/bin/env python3
"""The DeepSpeed side of the peer benchmark (benchmarks/peers/, docs/benchmarks.md).

  python deepspeed_step.py --modes=stage0,stage2,stage2_offload --device=cuda --world=1
      --vocab=25600 --d-model=768 --n-layer=12 --n-head=12 --block-size=512
      --micro-batch=4 --backwards=4

The same processes, model (torch_step.build_model: TinyGpt module for
module), data, timing and JSON lines as torch_step.py, with the model under
deepspeed.initialize (DeepSpeed 0.19.8) instead of DDP or FSDP2. A mode is
stage<k> (ZeRO stage k, 0-3) with any of the suffixes
  _offload  zero_optimization.offload_optimizer.device "cpu" (stages 1-3)
  _managed  managed_gradient_accumulation true: N (backward, step) pairs,
            DeepSpeed's own accumulation counting the boundary
and without _managed DeepSpeed 0.19.8's managed_gradient_accumulation:
false: N engine.backward() calls, then one engine.step(), the boundary the
caller's (zerostep_step's unmanaged windows). gradient_accumulation_steps is
N in both: engine.backward() divides the loss by it (scale_wrt_gas). fp32,
AdamW lr 1e-4, weight decay 0.01: PyTorch's fused AdamW given as the client
optimizer (zero_allow_untested_optimizer; with offload,
zero_force_ds_cpu_optimizer false, so the host step is that fused AdamW on
host tensors, not DeepSpeedCPUAdam: no DeepSpeed op is compiled, so none
needs nvcc or Python's headers at run time). Stage 3 partitions every
parameter (stage3_param_persistence_threshold 0), as zerostep's stage3 and
FSDP2 do.

DeepSpeed is imported inside each rank, after DS_ACCELERATOR is set ("cpu"
for --device=cpu, DeepSpeed's CPU accelerator on gloo; "cuda" otherwise); a
missing DeepSpeed is a ModeUnsupported line per mode naming the fix
(`pip install deepspeed==0.19.8`, or the wheels gpu_pack carries).
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_step  # noqa: E402

DEEPSPEED_VERSION = "0.19.8"
DEEPSPEED_MODES = ("stage0", "stage1", "stage2", "stage3", "stage1_offload", "stage2_offload",
                   "stage3_offload",
                   "stage0_managed", "stage1_managed", "stage2_managed", "stage3_managed",
                   "stage1_offload_managed", "stage2_offload_managed")


def ds_config(a, mode):
    stage = int(mode[5])
    zero = {"stage": stage}
    if "_offload" in mode:
        # Page-locked host buffers on cuda, as FSDP2's CPUOffloadPolicy there.
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": a.device == "cuda"}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": a.backwards,
        "managed_gradient_accumulation": mode.endswith("_managed"),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def deepspeed_mode(a, mode, device, loss_of, sync):
    os.environ["DS_ACCELERATOR"] = "cuda" if device.type == "cuda" else "cpu"
    try:
        import deepspeed
    except ImportError as e:
        raise torch_step.ModeUnsupported(
            "DeepSpeed is not importable here (%s). Fix: pip install deepspeed==%s "
            "(DS_BUILD_OPS=0), or the wheels tools/gpu_check.sh pack carries" % (e, DEEPSPEED_VERSION))
    if deepspeed.__version__ != DEEPSPEED_VERSION:
        raise torch_step.ModeUnsupported("DeepSpeed %s is not %s, the version this benchmark "
                                         "was written for" % (deepspeed.__version__, DEEPSPEED_VERSION))
    import torch
    torch.manual_seed(a.seed)
    model = torch_step.build_model(a).to(device)
    if not deepspeed.comm.is_initialized():
        # The process group torch_step made; DeepSpeed's comm wraps it.
        deepspeed.init_distributed(dist_backend=a.backend, auto_mpi_discovery=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(a, mode))

    def backward(loss, last):
        engine.backward(loss)  # divided by N inside (scale_wrt_gas)

    def step(last):
        engine.step()

    managed = mode.endswith("_managed")
    steps_before = engine.global_steps
    times = torch_step.time_windows(a, engine, lambda last: contextlib.nullcontext(), backward,
                                    step, loss_of, sync, managed=managed)
    if engine.global_steps - steps_before != a.warmup + a.windows:
        raise SystemExit("deepspeed_step: %s: %d windows applied %d updates" % (
            mode, a.warmup + a.windows, engine.global_steps - steps_before))
    times["extra"] = {"deepspeed": deepspeed.__version__,
                      "optimizer": type(engine.optimizer).__name__}
    engine.destroy()
    return times


def main(argv):
    a = torch_step.parse(argv, DEEPSPEED_MODES, __doc__.splitlines()[0])
    if a.count_params:
        print(torch_step.param_count(a))
        return 0
    torch_step.run_ranks(a, "deepspeed", deepspeed_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
