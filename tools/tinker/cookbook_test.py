"""The tinker-cookbook's own loops against //tools:trainer_server (issue 43).

Run by tools/tinker/cookbook_test.sh inside a virtual environment holding
the pinned SDK, the cookbook's dependencies (tools/tinker/
cookbook_requirements.txt, torch through the pinned install) and
tinker-cookbook itself (installed with --no-deps: it pins tml-renderers,
which PyPI lacks). Usage:

    python cookbook_test.py --server=PATH/trainer_server [--only=NAME]

Every scenario runs a cookbook entry point unchanged (its `main` with a
`Config`), on the server's byte-level base model `zerostep/tiny-gpt` (64
tokens of context, vocabulary 256) through the `role_colon` renderer and a
byte tokenizer registered under the model's name (nothing can be
downloaded here). Scenarios:

  supervised       supervised.train.main on a JSONL of conversations, with
                   a checkpoint and resume of the last state;
  rl-sync          rl.train.main with its default loss
                   (importance_sampling), synchronous;
  rl-async         rl.train.main with AsyncConfig and its defaults: loss
                   stable_reinforce, samples recorded with
                   record_stability_info, datums with provenance;
  distillation     distillation.train_off_policy.main: the teacher's
                   topk_prompt_logprobs as cross_entropy's soft targets;
  sdft             distillation.sdft.main (self-distillation), forward
                   (top-k soft targets) and reverse (forward_backward_custom
                   over the teacher's top-k);
  rest             the REST client over what the loops left: runs,
                   checkpoints, sessions, TTLs, deletes, external weights
                   downloaded with the SDK's CLI code, copy_weights.
"""

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import local_server  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)
logging.basicConfig(level=logging.WARNING)

import chz  # noqa: E402
import numpy as np  # noqa: E402
import tinker  # noqa: E402
from tinker import types  # noqa: E402

from tinker_cookbook import renderers, tokenizer_utils  # noqa: E402

BASE = "zerostep/tiny-gpt"
RENDERER = "role_colon"


class ByteTokenizer:
    """The server's tokens are bytes: what the cookbook's renderers and
    loops call of a Hugging Face tokenizer, for a 256-token vocabulary with
    no special tokens."""

    name_or_path = BASE
    eos_token_id = None
    bos_token = None
    eos_token = None
    vocab_size = 256

    def encode(self, text, add_special_tokens=False, **_):
        return list(text.encode("utf-8"))

    def decode(self, ids, **_):
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def __call__(self, text, **_):
        return {"input_ids": self.encode(text)}

    def __len__(self):
        return 256


tokenizer_utils.register_tokenizer(BASE, ByteTokenizer)


def seconds(fn):
    start = time.time()
    fn()
    took = time.time() - start
    print("  loop time %.1f s" % took, flush=True)
    return took


# ---- Supervised -------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "sky?"}, {"role": "assistant", "content": "blue"}],
    [{"role": "user", "content": "cat"}, {"role": "assistant", "content": "meow"}],
]


def conversations(path, copies):
    """The cookbook's dataset builder over a JSONL of CONVERSATIONS
    (`copies` times each), in batches of 4, at most 64 tokens."""
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    with open(path, "w") as f:
        for c in CONVERSATIONS * copies:
            f.write(json.dumps({"messages": c}) + "\n")
    return FromConversationFileBuilder(
        file_path=path,
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=BASE,
            renderer_name=RENDERER,
            max_length=64,
            batch_size=4,
        ),
    )


def supervised(server, work):
    from tinker_cookbook.supervised import train as sl_train

    dataset = conversations(os.path.join(work, "conversations.jsonl"), 4)

    def config(log_path, max_steps):
        return sl_train.Config(
            log_path=log_path,
            model_name=BASE,
            recipe_name="zerostep_cookbook_test",
            renderer_name=RENDERER,
            dataset_builder=dataset,
            learning_rate=2e-2,
            lora_rank=4,
            base_url=server.url,
            save_every=2,
            eval_every=0,
            max_steps=max_steps,
        )

    log_path = os.path.join(work, "sl")
    seconds(lambda: asyncio.run(sl_train.main(config(log_path, 2))))
    metrics = read_metrics(log_path)
    losses = [m["train_mean_nll"] for m in metrics if "train_mean_nll" in m]
    print("  supervised train_mean_nll", ["%.3f" % x for x in losses])
    assert losses and all(math.isfinite(x) for x in losses), metrics
    # Resume: a second run over the same log path loads the last saved
    # state with its optimizer (create_training_client_from_state_with_
    # optimizer) and finds the training done.
    with open(os.path.join(log_path, "checkpoints.jsonl")) as f:
        saved = [json.loads(line) for line in f if line.strip()]
    assert saved and saved[-1]["name"] == "final", saved
    seconds(lambda: asyncio.run(sl_train.main(config(log_path, 2))))
    assert len(read_metrics(log_path)) == len(metrics), "the resumed run trained again"


def read_metrics(log_path):
    path = os.path.join(log_path, "metrics.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- RL ----------------------------------------------------------------------


def vowel_group_builders(groups, group_size):
    """`groups` of the cookbook's ProblemGroupBuilder over a toy task:
    reward 1 when the reply starts with an ASCII character (about half of
    the untrained model's replies, so groups have nonzero advantages)."""
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder

    class VowelEnv(ProblemEnv):
        def get_question(self):
            return "say aeiou"

        def check_answer(self, sample_str):
            return sample_str[:1].isascii() and sample_str[:1] != ""

        def check_format(self, sample_str):
            return True

        def get_reference_answer(self):
            return "aeiou"

    renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(BASE))
    return [
        ProblemGroupBuilder(
            env_thunk=lambda: VowelEnv(renderer, format_coef=0.0),
            num_envs=group_size,
        )
        for _ in range(groups)
    ]


def rl_config(server, log_path, async_config=None, max_steps=4):
    """rl.train.Config over vowel_group_builders' toy task."""
    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder

    class VowelDataset(RLDataset):
        def __init__(self, batches, group_size):
            self.batches = batches
            self.group_size = group_size

        def get_batch(self, index):
            return vowel_group_builders(2, self.group_size)

        def __len__(self):
            return self.batches

    @chz.chz
    class VowelBuilder(RLDatasetBuilder):
        batches: int = 4
        group_size: int = 4

        async def __call__(self):
            return VowelDataset(self.batches, self.group_size), None

    kwargs = dict(
        learning_rate=2e-2,
        dataset_builder=VowelBuilder(batches=max_steps),
        model_name=BASE,
        recipe_name="zerostep_cookbook_test",
        renderer_name=RENDERER,
        max_tokens=8,
        log_path=log_path,
        base_url=server.url,
        lora_rank=4,
        eval_every=0,
        save_every=2,
        num_groups_to_log=0,
        rollout_json_export=False,
        max_steps=max_steps,
    )
    if async_config is not None:
        kwargs["async_config"] = async_config
    return rl_train, rl_train.Config(**kwargs)


def rl_sync(server, work):
    rl_train, config = rl_config(server, os.path.join(work, "rl-sync"))
    assert config.training_loss_fn() == "importance_sampling"
    seconds(lambda: asyncio.run(rl_train.main(config)))
    check_rl_metrics(os.path.join(work, "rl-sync"))


def rl_async(server, work):
    from tinker_cookbook.rl.train import AsyncConfig

    rl_train, config = rl_config(
        server,
        os.path.join(work, "rl-async"),
        async_config=AsyncConfig(max_steps_off_policy=1, groups_per_batch=2),
    )
    # The defaults: stable_reinforce, which needs the sampler's records.
    assert config.training_loss_fn() == "stable_reinforce"
    assert config.records_stability_info()
    seconds(lambda: asyncio.run(rl_train.main(config)))
    check_rl_metrics(os.path.join(work, "rl-async"))


def check_rl_metrics(log_path):
    metrics = read_metrics(log_path)
    rewards = [m["env/all/reward/total"] for m in metrics if "env/all/reward/total" in m]
    print("  rewards", ["%.2f" % r for r in rewards])
    assert len(rewards) >= 3, metrics
    assert all(math.isfinite(r) for r in rewards), rewards
    # Groups with mixed rewards: some steps trained on nonzero advantages.
    assert any(0 < r < 1 for r in rewards), rewards


# ---- Distillation -----------------------------------------------------------


def distillation(server, work):
    from tinker_cookbook.distillation import train_off_policy as distill
    from tinker_cookbook.distillation.datasets import TeacherConfig

    log_path = os.path.join(work, "distill")
    config = distill.Config(
        learning_rate=1e-2,
        dataset_configs=[
            distill.DatasetWithTeacher(
                dataset_builder=conversations(os.path.join(work, "distill.jsonl"), 2),
                teacher_config=TeacherConfig(base_model=BASE),
            )
        ],
        model_name=BASE,
        recipe_name="zerostep_cookbook_test",
        renderer_name=RENDERER,
        lora_rank=4,
        n_teacher_targets=5,
        batch_size=4,
        save_every=0,
        eval_every=0,
        max_steps=2,
        log_path=log_path,
        base_url=server.url,
    )
    # The loop falls back to hard targets (with a warning) when the teacher
    # returns no topk_prompt_logprobs: count those.
    fallbacks = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "falling back to hard targets" in record.getMessage():
                fallbacks.append(record)

    handler = Catch()
    logging.getLogger(distill.__name__).addHandler(handler)
    try:
        seconds(lambda: asyncio.run(distill.main(config)))
    finally:
        logging.getLogger(distill.__name__).removeHandler(handler)
    assert not fallbacks, "the teacher returned no top-k prompt logprobs"
    metrics = read_metrics(log_path)
    losses = [m["train/loss:sum"] for m in metrics if "train/loss:sum" in m]
    print("  distillation train/loss:sum", ["%.2f" % x for x in losses])
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), metrics



def sdft(server, work):
    """distillation.sdft.main, self-distillation: the base model, shown the
    golden answer, is the teacher of the student's own samples; its
    topk_prompt_logprobs over the student's completions are the soft
    targets of cross_entropy (reverse=False) or weigh the analytic reverse
    KL of a forward_backward_custom (reverse=True)."""
    from tinker_cookbook.distillation import sdft as sdft_train

    class Problems:
        def get_batch(self, index):
            return vowel_group_builders(2, 1), ["say aeiou"] * 2, ["aeiou"] * 2

        def __len__(self):
            return 2

    for reverse in (False, True):
        log_path = os.path.join(work, "sdft-reverse" if reverse else "sdft")
        config = sdft_train.Config(
            model_name=BASE,
            recipe_name="zerostep_cookbook_test",
            renderer_name=RENDERER,
            lora_rank=4,
            base_url=server.url,
            learning_rate=1e-3,
            max_tokens=8,
            topk=5,
            reverse=reverse,
            # The default template does not fit the model's 64 tokens.
            demo_template="{question} e.g. {golden_answer}",
            max_context_length=64,
            eval_every=0,
            save_every=0,
            max_steps=2,
            log_path=log_path,
        )
        seconds(lambda: asyncio.run(sdft_train.main(config, Problems())))
        metrics = read_metrics(log_path)
        key = "sdft/reverse_kl_positions" if reverse else "sdft/total_completion_tokens"
        tokens = [m.get(key, 0) for m in metrics]
        print("  sdft reverse=%s %s" % (reverse, key), tokens)
        # Every step distilled some tokens through the teacher's top-k.
        assert len(metrics) == 2 and all(t > 0 for t in tokens), metrics
        assert all(math.isfinite(m["sdft/mean_teacher_entropy"]) for m in metrics), metrics


# ---- REST ---------------------------------------------------------------------


def rest(server, work):
    """The REST client over the server: what the loops use (runs by tinker
    path, rolling-checkpoint deletes) and the rest of its surface."""
    sc = tinker.ServiceClient(base_url=server.url, api_key=local_server.API_KEY)
    rc = sc.create_rest_client()
    tc = sc.create_lora_training_client(base_model=BASE, rank=4, user_metadata={"k": "v"})
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(list(b"hello there")),
        loss_fn_inputs={"target_tokens": np.array(list(b"ello there!"), dtype=np.int64)},
    )
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = tc.save_state("s1", ttl_seconds=7200).result().path
    sampler = tc.save_weights_for_sampler("p1").result().path

    run = rc.get_training_run_by_tinker_path(state).result()
    assert run.training_run_id == tc.model_id and run.is_lora and run.lora_rank == 4, run
    assert run.user_metadata == {"k": "v"}, run.user_metadata
    assert run.last_checkpoint.tinker_path == state, run
    assert run.last_sampler_checkpoint.tinker_path == sampler, run
    runs = rc.list_training_runs(limit=50).result()
    assert tc.model_id in [r.training_run_id for r in runs.training_runs], runs
    assert runs.cursor.total_count >= 1
    listed = rc.list_checkpoints(tc.model_id).result().checkpoints
    assert {c.tinker_path for c in listed} == {state, sampler}, listed
    ttl = [c for c in listed if c.tinker_path == state][0].expires_at
    assert ttl is not None, listed
    # TTL: changed, removed, out of range refused.
    rc.set_checkpoint_ttl_from_tinker_path(state, 86400).result()
    rc.set_checkpoint_ttl_from_tinker_path(state, None).result()
    assert [c for c in rc.list_checkpoints(tc.model_id).result().checkpoints
            if c.tinker_path == state][0].expires_at is None
    try:
        rc.set_checkpoint_ttl_from_tinker_path(state, 10).result()
        raise AssertionError("a TTL of 10 s was accepted")
    except tinker.BadRequestError as e:
        assert "3600" in str(e), e
    sessions = rc.list_sessions().result().sessions
    assert sc.holder.get_session_id() in sessions, sessions
    info = rc.get_session(sc.holder.get_session_id()).result()
    assert tc.model_id in info.training_run_ids, info
    # Delete: gone from the listing, and a second delete is a 404.
    rc.delete_checkpoint_from_tinker_path(sampler).result()
    assert [c.tinker_path for c in rc.list_checkpoints(tc.model_id).result().checkpoints] == [state]
    try:
        rc.delete_checkpoint_from_tinker_path(sampler).result()
        raise AssertionError("a second delete succeeded")
    except tinker.NotFoundError:
        pass
    # External weights, downloaded by the SDK's CLI code (signed URLs, no
    # key), read back with safetensors: PEFT's adapter, the trained bits.
    external = tc.save_weights_external("final", ttl_seconds=3600).result().path
    assert external == "tinker://%s/external_weights/final" % tc.model_id, external
    urls = rc.get_external_weights_urls(external).result()
    assert set(urls.urls) == {"adapter_config.json", "adapter_model.safetensors"}, urls
    from pathlib import Path

    from tinker.cli.commands.checkpoint import _download_checkpoint

    dest = Path(work) / "download"
    dest.mkdir()
    size = _download_checkpoint(rc, external, dest, show_progress=False, format="json")
    assert size > 0
    config = json.loads((dest / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4, config
    from safetensors.numpy import load_file

    tensors = load_file(str(dest / "adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.") and k.endswith(".weight") for k in tensors), list(tensors)
    # The bits the server trains: FNV-1a 64 over the adapters in the
    # file's data order (the engine's) equals get_info's param_digest.
    raw = (dest / "adapter_model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    order = sorted((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][0])
    blob = b"".join(tensors[k].astype(np.float32).tobytes() for k in order)
    # engine/checkpoint_io.cc's fnv1a64 starts from 1469598103934665603,
    # not FNV's 14695981039346656037 (a digit short): the server's digest.
    h = 1469598103934665603
    for byte in blob:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    status, body = post_json(server, "get_info", {"model_id": tc.model_id})
    assert "%016x" % h == body["param_digest"], ("%016x" % h, body)
    # copy_weights: a new run holding the copy, which loads.
    copied = rc.copy_weights(state, "zerostep-project").result()
    assert copied.startswith("tinker://copy-") and copied.endswith("/weights/s1"), copied
    restored = sc.create_training_client_from_state(copied)
    assert post_json(server, "get_info", {"model_id": restored.model_id})[1][
        "param_digest"] == body["param_digest"]
    info = rc.get_weights_info_by_tinker_path(copied).result()
    assert info.base_model == BASE and info.lora_rank == 4, info
    sc.close("success").result()


def post_json(server, endpoint, body):
    import urllib.request

    req = urllib.request.Request(server.url + "/api/v1/" + endpoint,
                                 data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("X-API-Key", local_server.API_KEY)
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.environ["TINKER_API_KEY"] = local_server.API_KEY
    import tinker_cookbook

    print("tinker SDK", tinker.__version__, "cookbook", tinker_cookbook.__version__)
    work = tempfile.mkdtemp(prefix="zerostep-cookbook-")
    server = local_server.ServerProcess(args.server, "--world=1", "--stage=0", quiet=True)
    scenarios = [("supervised", supervised), ("rl-sync", rl_sync), ("rl-async", rl_async),
                 ("distillation", distillation), ("sdft", sdft), ("rest", rest)]
    try:
        code = local_server.run_scenarios(
            [(name, lambda fn=fn: fn(server, work)) for name, fn in scenarios], args.only)
        stopped = server.stop()
        assert stopped == 0, "the server's exit status after SIGTERM: %r" % stopped
        return code
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
