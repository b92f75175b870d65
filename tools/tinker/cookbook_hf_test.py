"""Issue 40: the trainer server on a Hugging Face folder, driven by the
unmodified tinker SDK and tinker-cookbook.

Run by tools/tinker/cookbook_test.sh (the cookbook's environment: the
pinned SDK, the cookbook installed with --no-deps, tokenizers 0.23.3 and
transformers 5.24.0). Usage:

    python cookbook_hf_test.py --server=PATH --make-hf-model=PATH
                               --make-tokenizer=PATH [--only=NAME]

The folder: make_hf_model's random Qwen3 (tiny preset, vocabulary 512, 256
positions) with a byte-level BPE trained here by make_tokenizer.py and
saved in it (tokenizer.json, tokenizer_config.json, eos_token_id). The
server serves it as --model=DIR=DIR, on 2 simulated ranks at ZeRO stage 3:
the base model's name is the folder's path, which is all that changes in
the cookbook's configs (model_name), since the cookbook's get_tokenizer()
and the SDK's (through get_info's tokenizer_id) load a local path with
AutoTokenizer. Nothing is registered or patched. Scenarios:

  sdk         the SDK alone: capabilities list the folder with its context,
              get_tokenizer() is the folder's, sampling stops on a stop
              string (through the server's reading of tokenizer.json), on a
              stop token and at max_tokens; every served loss runs; a state
              saved and loaded gives the same weights;
  supervised  supervised.train.main (role_colon renderer): the train NLL
              falls;
  rl          rl.train.main with importance_sampling: runs, and the
              sampler/trainer KL (optim/kl_sample_train_v1) is about 0.
"""

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import local_server  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)

import chz  # noqa: E402
import tinker  # noqa: E402
from tinker import types  # noqa: E402

RENDERER = "role_colon"
# |mean(sampler logprob - trainer logprob)| over every sampled token. The
# sampler's logprobs come from the KV-cached decode, the trainer's from one
# full forward of the same weights; they differ by float32 rounding only
# (models/hf_sampler_test.cc: within 2e-4 per token), so the mean is far
# below this bound, and a stale or wrong policy would exceed it.
KL_BOUND = 1e-3


def make_folder(work, make_hf_model, make_tokenizer):
    folder = os.path.join(work, "qwen3-tiny")
    subprocess.run([make_hf_model, "--out=" + folder, "--preset=tiny", "--arch=qwen3",
                    "--vocab=512", "--max-positions=256", "--seed=3"], check=True)
    subprocess.run([sys.executable, make_tokenizer, folder], check=True)
    return folder


def read_metrics(log_path):
    with open(os.path.join(log_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def sdk(server, folder):
    sc = tinker.ServiceClient(base_url=server.url)
    caps = sc.get_server_capabilities()
    served = {m.model_name: m for m in caps.supported_models}
    assert folder in served, list(served)
    assert getattr(served[folder], "max_context_length", 256) == 256, served[folder]
    tc = sc.create_lora_training_client(base_model=folder, rank=8)
    tok = tc.get_tokenizer()
    from transformers import AutoTokenizer

    mine = AutoTokenizer.from_pretrained(folder)
    text = "User: what colour is the sky?"
    assert tok.encode(text) == mine.encode(text), (tok.encode(text), mine.encode(text))
    info = tc.get_info()
    assert info.model_data.tokenizer_id == folder, info
    # Sampling on the base weights: a stop string is found in the decoded
    # text, a stop token ends a sample, max_tokens otherwise.
    samp = tc.save_weights_and_get_sampling_client("s0")
    prompt = types.ModelInput.from_ints(tok.encode("User: hi\n\nAssistant:"))
    free = samp.sample(prompt, 4, types.SamplingParams(max_tokens=24, seed=5, temperature=1.0)).result()
    for s in free.sequences:
        assert len(s.tokens) == len(s.logprobs) and all(math.isfinite(x) for x in s.logprobs)
    # A stop string made of the text of a free sample's tokens 3..5: the
    # same seed must stop right after the token that completes it.
    seq = free.sequences[0].tokens
    target = tok.decode(seq[3:6])
    if target:
        stopped = samp.sample(prompt, 1, types.SamplingParams(
            max_tokens=24, seed=5, temperature=1.0, stop=[target])).result().sequences[0]
        got = tok.decode(stopped.tokens)
        assert target in got and target not in tok.decode(stopped.tokens[:-1]), (target, got)
        assert stopped.stop_reason == "stop", stopped.stop_reason
        assert stopped.tokens == seq[:len(stopped.tokens)]
    by_id = samp.sample(prompt, 1, types.SamplingParams(
        max_tokens=24, seed=5, temperature=1.0, stop=[seq[2]])).result().sequences[0]
    assert by_id.tokens == seq[:seq.index(seq[2]) + 1], (by_id.tokens, seq)
    # Every served loss on a datum of the folder's tokens.
    ids = tok.encode("User: 2+2\n\nAssistant: 4\n\n")
    n = len(ids) - 1
    import numpy as np

    def datum(**extra):
        inputs = {"target_tokens": np.array(ids[1:], dtype=np.int64)}
        inputs.update(extra or {"weights": np.ones(n, dtype=np.float32)})
        return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                           loss_fn_inputs=inputs)

    base = np.full(n, -6.0, dtype=np.float32)
    adv = np.linspace(-1, 1, n).astype(np.float32)
    for loss in ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]:
        d = datum() if loss == "cross_entropy" else datum(
            logprobs=base, advantages=adv)
        out = tc.forward_backward([d], loss, {"beta": 0.1} if loss == "dro" else None).result()
        assert out.loss_fn_outputs, loss
        print("  %s loss %s" % (loss, out.metrics.get("loss:sum")))
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    before = tc.get_info().model_data
    state = tc.save_state("after-one-step").result().path
    digest = json.loads(json.dumps(post(server, "get_info", {"model_id": tc.model_id})))["param_digest"]
    tc.forward_backward([datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert post(server, "get_info", {"model_id": tc.model_id})["param_digest"] != digest
    tc.load_state(state).result()
    assert post(server, "get_info", {"model_id": tc.model_id})["param_digest"] == digest
    assert before.arch == "Qwen3ForCausalLM", before


def post(server, endpoint, body):
    import urllib.request

    req = urllib.request.Request(server.url + "/api/v1/" + endpoint,
                                 data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("X-API-Key", local_server.API_KEY)
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "what colour is the sky?"},
     {"role": "assistant", "content": "The sky is blue."}],
    [{"role": "user", "content": "cat"}, {"role": "assistant", "content": "meow"}],
]


def supervised(server, folder, work):
    from tinker_cookbook.supervised import train as sl_train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    path = os.path.join(work, "conversations.jsonl")
    with open(path, "w") as f:
        for c in CONVERSATIONS * 6:
            f.write(json.dumps({"messages": c}) + "\n")
    dataset = FromConversationFileBuilder(
        file_path=path,
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=folder, renderer_name=RENDERER,
            max_length=128, batch_size=4))
    log_path = os.path.join(work, "sl")
    config = sl_train.Config(
        log_path=log_path, model_name=folder, recipe_name="zerostep_hf_test",
        renderer_name=RENDERER, dataset_builder=dataset, learning_rate=2e-2,
        lora_rank=8, base_url=server.url, save_every=0, eval_every=0,
        max_steps=6)
    start = time.time()
    asyncio.run(sl_train.main(config))
    print("  supervised loop %.1f s" % (time.time() - start))
    losses = [m["train_mean_nll"] for m in read_metrics(log_path) if "train_mean_nll" in m]
    print("  train_mean_nll", ["%.3f" % x for x in losses])
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.5, losses


def rl(server, folder, work):
    from tinker_cookbook import renderers, tokenizer_utils
    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder

    class AsciiEnv(ProblemEnv):
        def get_question(self):
            return "say hello"

        def check_answer(self, sample_str):
            return sample_str[:1].isalpha()

        def check_format(self, sample_str):
            return True

        def get_reference_answer(self):
            return "hello"

    class Dataset(RLDataset):
        def __init__(self, batches):
            self.batches = batches

        def get_batch(self, index):
            renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(folder))
            return [ProblemGroupBuilder(env_thunk=lambda: AsciiEnv(renderer, format_coef=0.0),
                                        num_envs=4) for _ in range(2)]

        def __len__(self):
            return self.batches

    @chz.chz
    class Builder(RLDatasetBuilder):
        batches: int = 3

        async def __call__(self):
            return Dataset(self.batches), None

    log_path = os.path.join(work, "rl")
    config = rl_train.Config(
        learning_rate=1e-2, dataset_builder=Builder(), model_name=folder,
        recipe_name="zerostep_hf_test", renderer_name=RENDERER, max_tokens=12,
        log_path=log_path, base_url=server.url, lora_rank=8, eval_every=0,
        save_every=0, num_groups_to_log=0, rollout_json_export=False,
        max_steps=3)
    assert config.training_loss_fn() == "importance_sampling"
    start = time.time()
    asyncio.run(rl_train.main(config))
    print("  rl loop %.1f s" % (time.time() - start))
    metrics = read_metrics(log_path)
    kls = [m["optim/kl_sample_train_v1"] for m in metrics if "optim/kl_sample_train_v1" in m]
    print("  kl_sample_train_v1", ["%.2e" % k for k in kls])
    assert len(kls) >= 3, metrics
    assert all(abs(k) < KL_BOUND for k in kls), kls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--make-hf-model", required=True)
    ap.add_argument("--make-tokenizer", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.environ["TINKER_API_KEY"] = local_server.API_KEY
    work = tempfile.mkdtemp(prefix="zerostep-cookbook-hf-")
    start = time.time()
    folder = make_folder(work, os.path.abspath(args.make_hf_model),
                         os.path.abspath(args.make_tokenizer))
    server = local_server.ServerProcess(
        args.server, "--world=2", "--stage=3", "--model=%s=%s" % (folder, folder), quiet=True)
    scenarios = [("sdk", lambda: sdk(server, folder)),
                 ("supervised", lambda: supervised(server, folder, work)),
                 ("rl", lambda: rl(server, folder, work))]
    try:
        code = local_server.run_scenarios(scenarios, args.only)
        assert server.stop() == 0
        print("cookbook_hf_test: %.0f s in all" % (time.time() - start))
        return code
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
