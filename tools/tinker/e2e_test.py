"""End-to-end test of //tools:trainer_server driven by the official tinker SDK.

Run by tools/tinker/e2e_test.sh inside a virtual environment holding the
pinned SDK (tools/tinker/requirements.txt). Usage:

    python e2e_test.py --server=PATH/trainer_server [--only=NAME]

Each scenario starts its own server on a free loopback port, drives it and
stops it. Parameters are compared through the digest the server reports
(optim_step metrics param_digest_hi/lo, get_info's param_digest: FNV-1a 64
of every trainable float32 parameter in order).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import local_server  # noqa: E402
import tinker
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

warnings.simplefilter("ignore", FutureWarning)

API_KEY = local_server.API_KEY
BASE = "zerostep/tiny-gpt"
# A random tiny Hugging Face decoder with rank-4 LoRA learns the four texts
# more slowly than the toy GPT: a smaller step, more of them, a smaller fall
# (the loss still falls at every step).
HF_FIT = {"lr": float(os.environ.get("E2E_HF_LR", "1e-2")),
          "steps": int(os.environ.get("E2E_HF_STEPS", "8")),
          "fall": 0.95}

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "zerostep trains with a caller owned boundary",
    "one optim step after many forward backward calls",
    "sum the gradients over the window then step",
    "data parallel ranks behind one http server",
    "lora adapters train while the base is frozen",
    "bitwise equal parameters whatever the split",
    "a tiny model keeps the test fast on two cores",
]


class Server(local_server.ServerProcess):
    """A trainer_server process on a free port (tools/tinker/local_server.py),
    with raw-HTTP helpers for the protocol-level checks."""

    def post(self, endpoint, body, content_type="application/json", accept=None, key=API_KEY):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + "/api/v1/" + endpoint, data=data, method="POST")
        req.add_header("Content-Type", content_type)
        req.add_header("X-API-Key", key)
        if accept:
            req.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read()

    def post_json(self, endpoint, body):
        status, _, raw = self.post(endpoint, body)
        return status, json.loads(raw)

    def session(self):
        """A session of this server (create_model and create_sampling_session
        take only ids create_session gave), made once."""
        if getattr(self, "_session", None) is None:
            status, body = self.post_json("create_session", {})
            assert status == 200, body
            self._session = body["session_id"]
        return self._session

    def result(self, request_id, accept="application/x-protobuf", proto=None):
        """Polls retrieve_future until the future is done; (kind, payload).
        A protobuf result is parsed as `proto` (ForwardBackwardOutput by
        default)."""
        for _ in range(100):
            status, ctype, raw = self.post(
                "retrieve_future", {"request_id": request_id}, accept=accept
            )
            assert status == 200, (status, raw)
            if "application/x-protobuf" in ctype:
                out = (proto or pb.ForwardBackwardOutput)()
                out.ParseFromString(raw)
                return "proto", out
            body = json.loads(raw)
            if body.get("type") == "try_again":
                continue
            if "error" in body:
                return "error", body
            return "json", body
        raise AssertionError("future never finished: " + request_id)

    def digest(self, model_id):
        status, body = self.post_json("get_info", {"model_id": model_id})
        assert status == 200, body
        return body["param_digest"]


def encode(text):
    return list(text.encode())


def datum(text):
    tokens = encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


def optim_digest(metrics):
    hi = int(metrics["param_digest_hi:unique"])
    lo = int(metrics["param_digest_lo:unique"])
    return "%016x" % ((hi << 32) | lo)


def training_client(sc, rank=4, seed=7, base=BASE, **lora):
    tc = sc.create_lora_training_client(base_model=base, rank=rank, seed=seed, **lora)
    return tc.result() if hasattr(tc, "result") and not hasattr(tc, "forward_backward") else tc


def adam(lr=2e-2):
    return types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)


def check_training(server, world, base=BASE, lr=5e-2, steps=6, fall=0.8):
    """Loss falls; N forward_backward + 1 optim_step == 1 forward_backward
    with all the data + 1 optim_step, bitwise; save_state / load_state;
    every served loss. `base`: the built-in GPT or a served folder's name."""
    sc = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    caps = sc.get_server_capabilities()
    names = [m.model_name for m in caps.supported_models]
    assert base in names, names

    # The loss falls over steps.
    tc = training_client(sc, base=base)
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 4, info
    data = [datum(t) for t in TEXTS[:4]]
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(adam(lr))
        out = fb.result()
        opt.result()
        losses.append(out.metrics["loss:sum"])
        # loss:sum is the sum over datums of -sum(weights * logprobs).
        recomputed = -sum(float(np.sum(o["logprobs"].to_numpy())) for o in out.loss_fn_outputs)
        assert math.isclose(out.metrics["loss:sum"], recomputed, rel_tol=1e-5), (
            out.metrics, recomputed)
    print("losses", ["%.3f" % x for x in losses])
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < fall * losses[0], losses

    if base != BASE:
        # Issue 40: train_unembed alone adapts a folder's lm_head (the
        # other clients train it too: the SDK's default train_unembed=True).
        head = training_client(sc, seed=3, base=base, train_attn=False, train_mlp=False)
        head_losses = []
        for _ in range(3):
            fb = head.forward_backward(data, "cross_entropy")
            head.optim_step(adam(lr)).result()
            head_losses.append(fb.result().metrics["loss:sum"])
        print("lm_head alone: losses", ["%.3f" % x for x in head_losses])
        assert all(b < a for a, b in zip(head_losses, head_losses[1:])), head_losses

    # Split vs whole: requests of 1, world and world datums (counts the world
    # size does not divide) against one request carrying all of them (Note
    # [Window positions] in trainer.h).
    split, whole = training_client(sc, seed=11, base=base), training_client(sc, seed=11, base=base)
    chunk = [datum(t) for t in TEXTS[: 2 * world + 1]]
    bounds = [0, 1, 1 + world, len(chunk)]
    for step in range(2):
        futures = [split.forward_backward(chunk[bounds[i]:bounds[i + 1]], "cross_entropy")
                   for i in range(len(bounds) - 1)]
        d_split = optim_digest(split.optim_step(adam()).result().metrics)
        split_lp = [o["logprobs"].to_numpy() for f in futures for o in f.result().loss_fn_outputs]
        fb = whole.forward_backward(chunk, "cross_entropy")
        d_whole = optim_digest(whole.optim_step(adam()).result().metrics)
        whole_lp = [o["logprobs"].to_numpy() for o in fb.result().loss_fn_outputs]
        print("step", step, "split", d_split, "whole", d_whole)
        assert d_split == d_whole, (step, d_split, d_whole)
        assert all(np.array_equal(a, b) for a, b in zip(split_lp, whole_lp))
    assert server.digest(split.model_id) == server.digest(whole.model_id)

    # save_state / load_state (weights only) and a client from the state.
    path = split.save_state("after-2").result().path
    saved = server.digest(split.model_id)
    assert path.startswith("tinker://"), path
    split.forward_backward(chunk[:world], "cross_entropy")
    moved = optim_digest(split.optim_step(adam()).result().metrics)
    assert moved != saved
    split.load_state(path).result()
    assert server.digest(split.model_id) == saved
    restored = sc.create_training_client_from_state(path)
    restored = restored.result() if hasattr(restored, "result") else restored
    assert server.digest(restored.model_id) == saved

    # Other losses: the reported loss is the documented formula of the
    # returned logprobs.
    q = [np.full(len(encode(t)) - 1, -3.0, dtype=np.float32) for t in TEXTS[:2]]
    adv = [np.linspace(-1, 1, len(encode(t)) - 1).astype(np.float32) for t in TEXTS[:2]]
    mask = [(np.arange(len(encode(t)) - 1) >= 3).astype(np.int64) for t in TEXTS[:2]]
    clip = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    for loss_fn, cfg in [("importance_sampling", None), ("ppo", clip), ("cispo", clip),
                         ("dro", {"beta": 0.05}), ("gspo", clip)]:
        rl = []
        for i, t in enumerate(TEXTS[:2]):
            inputs = {"target_tokens": np.array(encode(t)[1:], dtype=np.int64),
                      "logprobs": q[i], "advantages": adv[i]}
            if loss_fn == "gspo":
                inputs["sequence_ratio_mask"] = mask[i]
            rl.append(types.Datum(model_input=types.ModelInput.from_ints(encode(t)[:-1]),
                                  loss_fn_inputs=inputs))
        out = tc.forward(rl, loss_fn, cfg).result()
        expected = 0.0
        for i, o in enumerate(out.loss_fn_outputs):
            lp = o["logprobs"].to_numpy().astype(np.float64)
            ratio = np.exp(lp - q[i])
            if loss_fn == "ppo":
                obj = np.minimum(ratio * adv[i], np.clip(ratio, 0.9, 1.1) * adv[i])
            elif loss_fn == "cispo":
                obj = np.clip(ratio, 0.9, 1.1) * lp * adv[i]
            elif loss_fn == "dro":
                obj = lp * adv[i] - 0.5 * 0.05 * (lp - q[i]) ** 2
            elif loss_fn == "gspo":
                s = np.exp(np.mean((lp - q[i])[mask[i] != 0]))
                obj = np.minimum(s * adv[i], np.clip(s, 0.9, 1.1) * adv[i])
            else:
                obj = ratio * adv[i]
            expected += -float(np.sum(obj))
        assert math.isclose(out.metrics["loss:sum"], expected, rel_tol=1e-4, abs_tol=1e-4), (
            loss_fn, out.metrics, expected)
    sc.close("success").result()


def fb_body(model_id, seq_id, texts, loss_fn="cross_entropy", mutate=None):
    req = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn=loss_fn)
    for t in texts:
        tokens = encode(t)
        d = req.data.add()
        d.model_input.add().encoded_text.tokens = np.array(tokens[:-1], dtype=np.int32).tobytes()
        tt = d.loss_fn_inputs["target_tokens"]
        tt.dtype = pb.DTYPE_INT64
        tt.shape.append(len(tokens) - 1)
        tt.dense = np.array(tokens[1:], dtype=np.int64).tobytes()
        w = d.loss_fn_inputs["weights"]
        w.dtype = pb.DTYPE_FLOAT32
        w.shape.append(len(tokens) - 1)
        w.dense = np.ones(len(tokens) - 1, dtype=np.float32).tobytes()
    if mutate:
        mutate(req)
    return req.SerializeToString()


def check_bad_input(server):
    """Bad requests get clear errors and change nothing (digest)."""
    status, body = server.post_json(
        "create_model", {"session_id": server.session(), "model_seq_id": 0, "base_model": BASE,
                         "lora_config": {"rank": 2, "seed": 3}})
    assert status == 200, body
    model_id = body["model_id"]
    kind, res = server.result(body["request_id"])
    assert kind == "json" and res["model_id"] == model_id, res
    seq = [0]

    def next_seq():
        seq[0] += 1
        return seq[0]

    def fb(body_bytes):
        status, _, raw = server.post("forward_backward", body_bytes, "application/x-protobuf")
        assert status == 200, raw
        return server.result(json.loads(raw)["request_id"])

    def expect_error(kind_res, *needles):
        kind, res = kind_res
        assert kind == "error", (kind, res)
        assert res["category"] == "user", res
        for n in needles:
            assert n in res["error"], (n, res["error"])
        print("  error:", res["error"][:160])

    # One good step so the optimizer state is not trivial.
    kind, _ = fb(fb_body(model_id, next_seq(), TEXTS[:2]))
    assert kind == "proto"
    status, body = server.post_json("optim_step", {"model_id": model_id, "seq_id": next_seq(),
                                                   "adam_params": {"learning_rate": 0.01}})
    assert server.result(body["request_id"])[0] == "json"
    before = server.digest(model_id)

    # Malformed bodies: 4xx with a JSON error.
    status, _, raw = server.post("forward_backward", b"\xff\xff\xff\xff\x0f", "application/x-protobuf")
    assert 400 <= status < 500 and json.loads(raw)["error"], (status, raw)
    status, _, raw = server.post("optim_step", b"{not json")
    assert 400 <= status < 500 and json.loads(raw)["error"], (status, raw)

    # Unknown model.
    expect_error(fb(fb_body("no-such-model", 1, TEXTS[:1])), "unknown model_id")
    # optim_step with no forward_backward since the last step.
    status, body = server.post_json("optim_step", {"model_id": model_id, "seq_id": next_seq(),
                                                   "adam_params": {"learning_rate": 0.01}})
    expect_error(server.result(body["request_id"]), "no forward_backward")

    def wrong_shape(req):
        req.data[0].loss_fn_inputs["weights"].shape[0] = 3
        req.data[0].loss_fn_inputs["weights"].dense = np.ones(3, dtype=np.float32).tobytes()

    def wrong_dtype(req):
        t = req.data[1].loss_fn_inputs["target_tokens"]
        t.dtype = pb.DTYPE_FLOAT32
        t.dense = np.zeros(t.shape[0], dtype=np.float32).tobytes()

    def bf16(req):
        w = req.data[0].loss_fn_inputs["weights"]
        w.dtype = pb.DTYPE_BFLOAT16
        w.dense = np.zeros(w.shape[0], dtype=np.uint16).tobytes()

    def bytes_mismatch(req):
        req.data[0].loss_fn_inputs["weights"].dense = b"\x00" * 6

    def out_of_vocab(req):
        req.data[0].model_input[0].encoded_text.tokens = np.array([5, 300, 7], dtype=np.int32).tobytes()

    def missing_input(req):
        del req.data[0].loss_fn_inputs["target_tokens"]

    for mutate, needles in [
        (wrong_shape, ["data[0]", "weights", "shape [3]"]),
        (wrong_dtype, ["data[1]", "target_tokens", "integer"]),
        (bf16, ["DTYPE_BFLOAT16"]),
        (bytes_mismatch, ["holds 6 bytes"]),
        (out_of_vocab, ["outside the vocabulary"]),
        (missing_input, ["lacks 'target_tokens'"]),
    ]:
        # The bad datum is not the first: nothing of the good one may stick.
        expect_error(fb(fb_body(model_id, next_seq(), TEXTS[:2], mutate=mutate)), *needles)
    expect_error(fb(fb_body(model_id, next_seq(), [TEXTS[0] * 3])), "at most 64")
    expect_error(fb(fb_body(model_id, next_seq(), TEXTS[:1], loss_fn="hinge")), "not served")
    # stable_reinforce names the sampled sequences (Datum.with_provenance).
    def as_stable_reinforce(req):
        w = req.data[0].loss_fn_inputs.pop("weights")
        req.data[0].loss_fn_inputs["advantages"].CopyFrom(w)

    expect_error(fb(fb_body(model_id, next_seq(), TEXTS[:1], loss_fn="stable_reinforce",
                            mutate=as_stable_reinforce)),
                 "has no provenance", "record_stability_info")
    expect_error(fb(fb_body(model_id, next_seq(), [])), "no data")
    assert server.digest(model_id) == before
    # Had any bad request left a gradient behind, this step would apply it.
    status, body = server.post_json("optim_step", {"model_id": model_id, "seq_id": next_seq(),
                                                   "adam_params": {"learning_rate": 0.01}})
    expect_error(server.result(body["request_id"]), "no forward_backward")

    # A seq_id gap: the request waits for its predecessor, then fails.
    gap = seq[0] + 2
    status, _, raw = server.post("forward_backward", fb_body(model_id, gap, TEXTS[:1]),
                                 "application/x-protobuf")
    expect_error(server.result(json.loads(raw)["request_id"]), "never arrived", "gap")
    assert server.digest(model_id) == before

    # A retry returns the original future; another body with that seq_id is 409.
    s = next_seq()
    good = fb_body(model_id, s, TEXTS[:2])
    first = server.post("forward_backward", good, "application/x-protobuf")
    again = server.post("forward_backward", good, "application/x-protobuf")
    assert first[0] == again[0] == 200
    assert json.loads(first[2])["request_id"] == json.loads(again[2])["request_id"]
    other = server.post("forward_backward", fb_body(model_id, s, TEXTS[2:4]), "application/x-protobuf")
    assert other[0] == 409 and json.loads(other[2])["error"], other
    assert server.result(json.loads(first[2])["request_id"])[0] == "proto"
    # Out-of-order arrival is put back in order: s+2 (optim) before s+1 (fb).
    opt = server.post_json("optim_step", {"model_id": model_id, "seq_id": s + 2,
                                          "adam_params": {"learning_rate": 0.01}})[1]
    fbr = server.post("forward_backward", fb_body(model_id, s + 1, TEXTS[4:6]), "application/x-protobuf")
    assert server.result(json.loads(fbr[2])["request_id"])[0] == "proto"
    kind, res = server.result(opt["request_id"])
    assert kind == "json", res
    assert optim_digest(res["metrics"]) == server.digest(model_id) != before


def expect_sdk_error(fn, *needles, hidden=()):
    """fn() raises; its message holds every needle and none of `hidden`."""
    try:
        fn()
    except Exception as e:  # the SDK's RequestFailedError and friends
        message = str(e)
        for n in needles:
            assert n in message, (n, message)
        for h in hidden:
            assert h not in message, (h, message)
        print("  error:", message[:160])
        return
    raise AssertionError("no error; expected one naming " + repr(needles))


def check_robustness(server, binary):
    """Issue 15, through the SDK: non-finite hyperparameters, failed and
    unserved endpoints, ids, checkpoints and sampler weights across a
    restart, paths leaving the state dir, a mismatched base_model."""
    sc = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    tc = training_client(sc)
    tc.forward_backward([datum(TEXTS[0])], "cross_entropy").result()
    before = tc.get_info().model_id
    digest = server.digest(before)
    # NaN and infinity reach the server as null: an error naming the field,
    # never the default (learning_rate=nan used to train with 1e-4).
    for field, bad in [("learning_rate", float("nan")), ("beta1", float("inf")),
                       ("eps", float("-inf")), ("weight_decay", float("nan")),
                       ("grad_clip_norm", float("nan"))]:
        kwargs = dict(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
        kwargs[field] = bad
        params = types.AdamParams(**kwargs)
        expect_sdk_error(lambda: tc.optim_step(params).result(), "adam_params." + field)
    assert server.digest(before) == digest

    # Refused requests consume their seq_id: the next request runs. (It
    # used to be held for the missing seq_id until the gap timeout, 60 s,
    # and then fail with "a seq_id gap", which result() raises here.)
    expect_sdk_error(lambda: tc.save_weights_for_sampler("bad name!").result(),
                     "must be 1-128 characters")
    tc.optim_step(adam()).result()
    expect_sdk_error(lambda: tc.save_weights_external(
        "e", age_encryption_recipients=["age1" + "q" * 58]).result(),
        "age_encryption_recipients is not served")
    saved = tc.save_state("w").result().path
    sampler_path = tc.save_weights_for_sampler("r1").result().path
    sample_params = types.SamplingParams(max_tokens=8, seed=11)
    prompt = types.ModelInput.from_ints(encode("lora"))
    before_restart = [list(s.tokens) for s in sampling_client(
        sc.create_sampling_client(model_path=sampler_path)).sample(
            prompt, 2, sample_params).result().sequences]
    first_id = tc.get_info().model_id
    saved_digest = server.digest(first_id)

    # Every method a path does not serve: 405, a JSON body, an Allow header
    # (through the real HTTP front); HEAD gets the head alone.
    import http.client
    from urllib.parse import urlparse
    host = urlparse(server.url)
    for method, path, allow in [("PUT", "create_model", "POST"),
                                ("PATCH", "training_runs", "GET"),
                                ("OPTIONS", "asample", "POST"),
                                ("DELETE", "checkpoints", "GET"),
                                ("POST", "training_runs/x/checkpoints/weights/w/ttl", "PUT"),
                                ("TRACE", "no/such/path", "GET, POST")]:
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
        conn.request(method, "/api/v1/" + path, body=b"{}",
                     headers={"X-API-Key": API_KEY, "Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 405 and resp.getheader("Allow") == allow, (
            method, path, resp.status, resp.getheader("Allow"))
        assert ("method %s is not served" % method) in body["error"], body
        conn.close()
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    conn.request("HEAD", "/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY})
    resp = conn.getresponse()
    assert resp.status == 200 and int(resp.getheader("Content-Length")) > 0
    assert resp.read() == b""
    conn.close()

    # Paths that would leave the state dir, and errors that never show it.
    for bad in ["tinker://../weights/w", "tinker://./weights/w", "tinker:///weights/w",
                "tinker://" + first_id + "/weights/../w"]:
        expect_sdk_error(lambda: sc.create_training_client_from_state(bad).get_info(),
                         bad, hidden=[server.state_dir])
    # A link in the tenant's folder (tenants/default without keys) that
    # points outside the state directory.
    tenant_dir = os.path.join(server.state_dir, "tenants", "default")
    os.makedirs(tenant_dir, exist_ok=True)
    os.symlink(tempfile.gettempdir(), os.path.join(tenant_dir, "escape"))
    expect_sdk_error(lambda: sc.create_training_client_from_state(
        "tinker://escape/weights/w").get_info(), "tinker://escape/weights/w",
        hidden=[server.state_dir])
    expect_sdk_error(lambda: sc.create_training_client_from_state(
        saved, base_model="zerostep/small-gpt").get_info(),
        "zerostep/small-gpt", BASE)

    # A restart over the same state dir: new ids (no overwrite of the last
    # run's weights), and the last run's checkpoint loads.
    state_dir = server.state_dir
    server.keep_state = True
    assert server.stop() == 0
    again = Server(binary, "--world=1", "--stage=0", state_dir=state_dir)
    try:
        sc2 = tinker.ServiceClient(base_url=again.url, api_key=API_KEY)
        tc2 = training_client(sc2)
        assert tc2.get_info().model_id != first_id, first_id
        restored = sc2.create_training_client_from_state(saved)
        assert again.digest(restored.get_info().model_id) == saved_digest
        # Sampler weights saved by name are read back from the state dir.
        after = sampling_client(sc2.create_sampling_client(model_path=sampler_path))
        assert [list(s.tokens) for s in after.sample(
            prompt, 2, sample_params).result().sequences] == before_restart
    finally:
        again.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


# Logprobs of the same tokens from sample/compute_logprobs (KV-cache
# decoding on rank 0's snapshot) and from forward (the full recompute on the
# training model, datums dealt to ranks) agree within this much, not bit for
# bit: the cached path's matmuls have other shapes, so float32 sums round
# differently (models/sampler_test states 1e-5 for the same model in one
# process; 1e-4 leaves room for sums of O(5) logits over another rank's
# thread count).
LOGPROB_TOLERANCE = 1e-4


def sampling_client(fut):
    return fut.result() if hasattr(fut, "result") and not hasattr(fut, "sample") else fut


def forward_logprobs(tc, sequences):
    """forward()'s logprob of every token of each sequence after the first."""
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(s[1:], dtype=np.int64)})
            for s in sequences]
    out = tc.forward(data, "cross_entropy").result()
    return [np.asarray(o["logprobs"].data, dtype=np.float32) for o in out.loss_fn_outputs]


def check_sampling(server, world):
    """Issue 15 item 1, through the SDK: sampling on the trained weights."""
    sc = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    caps = sc.get_server_capabilities()
    assert all(m.sampleable for m in caps.supported_models), caps
    tc = training_client(sc)
    for _ in range(3):  # LoRA adapters move off zero
        tc.forward_backward([datum(t) for t in TEXTS[:2 * world]], "cross_entropy").result()
        tc.optim_step(adam()).result()
    sampler = sampling_client(tc.save_weights_and_get_sampling_client())
    prompt_tokens = encode("the quick")
    prompt = types.ModelInput.from_ints(prompt_tokens)
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    a = sampler.sample(prompt, 4, params, include_prompt_logprobs=True).result()
    b = sampler.sample(prompt, 4, params).result()
    tokens = [list(s.tokens) for s in a.sequences]
    assert len(tokens) == 4 and all(len(t) == 12 for t in tokens), tokens
    assert all(s.stop_reason == "length" for s in a.sequences)
    assert [list(s.tokens) for s in b.sequences] == tokens, "same seed, other tokens"
    assert len({s.sequence_id for s in a.sequences}) == 4
    c = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=12, seed=4321)).result()
    assert [list(s.tokens) for s in c.sequences] != tokens, "another seed, same tokens"

    # sample's logprobs (and prompt_logprobs) equal forward's for the tokens.
    ref = forward_logprobs(tc, [prompt_tokens + t for t in tokens])
    worst = 0.0
    for s, r in zip(a.sequences, ref):
        got = np.asarray(s.logprobs, dtype=np.float32)
        worst = max(worst, float(np.max(np.abs(got - r[len(prompt_tokens) - 1:]))))
    pl = a.prompt_logprobs
    assert pl[0] is None and len(pl) == len(prompt_tokens), pl
    worst = max(worst, float(np.max(np.abs(np.array(pl[1:], dtype=np.float32)
                                           - ref[0][:len(prompt_tokens) - 1]))))
    assert worst < LOGPROB_TOLERANCE, "sample vs forward logprobs differ by %g" % worst
    # compute_logprobs: the same, for a whole sequence.
    full = prompt_tokens + tokens[0]
    lps = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert lps[0] is None and len(lps) == len(full), lps
    diff = float(np.max(np.abs(np.array(lps[1:], dtype=np.float32) - ref[0])))
    assert diff < LOGPROB_TOLERANCE, diff
    print("  logprobs: sample/compute_logprobs vs forward, max |diff| %.2e" % max(worst, diff))

    # Greedy, and a stop token ends a sample (kept in its tokens).
    greedy = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=10, temperature=0.0)).result()
    g = list(greedy.sequences[0].tokens)
    assert list(greedy.sequences[1].tokens) == g
    stopped = sampler.sample(prompt, 1, types.SamplingParams(
        max_tokens=10, temperature=0.0, stop=[g[3]])).result().sequences[0]
    assert stopped.stop_reason == "stop" and list(stopped.tokens) == g[:g.index(g[3]) + 1], (
        stopped, g)
    if all(t < 128 for t in g[:3]):  # a stop string is its UTF-8 bytes
        s2 = sampler.sample(prompt, 1, types.SamplingParams(
            max_tokens=10, temperature=0.0, stop=bytes(g[1:3]).decode())).result().sequences[0]
        assert s2.stop_reason == "stop" and list(s2.tokens)[-2:] == g[1:3], (s2, g)

    # Named sampler weights; a sampling client from their path samples the
    # same weights. Snapshots: training on does not change either client.
    path = tc.save_weights_for_sampler("s1").result().path
    assert path.endswith("/sampler_weights/s1"), path
    by_path = sampling_client(sc.create_sampling_client(model_path=path))
    assert [list(s.tokens) for s in by_path.sample(prompt, 4, params).result().sequences] == tokens
    tc.forward_backward([datum(t) for t in TEXTS[:2 * world]], "cross_entropy").result()
    tc.optim_step(adam()).result()
    assert [list(s.tokens) for s in sampler.sample(prompt, 4, params).result().sequences] == tokens
    fresh = sampling_client(tc.save_weights_and_get_sampling_client())
    assert [list(s.tokens) for s in fresh.sample(prompt, 4, params).result().sequences] != tokens
    base = sampling_client(sc.create_sampling_client(base_model=BASE))
    assert len(base.sample(prompt, 1, params).result().sequences[0].tokens) == 12

    # Bad input: clear errors that name the field, value and rule. (The SDK
    # refuses to send a NaN sampling parameter itself; the server's answer
    # to a null one is in tools/tinker/sampling_test.)
    bad = [
        (types.SamplingParams(max_tokens=0), 1, ["max_tokens = 0 must be >= 1"]),
        (types.SamplingParams(max_tokens=200), 1, ["exceed the model's context of 64",
                                                   "lower max_tokens to at most 55"]),
        (types.SamplingParams(max_tokens=4, temperature=-1.0), 1, ["temperature = -1"]),
        (types.SamplingParams(max_tokens=4, top_p=0.0), 1, ["top_p = 0 must be in (0, 1]"]),
        (types.SamplingParams(max_tokens=4, top_k=-5), 1, ["top_k = -5"]),
        (types.SamplingParams(max_tokens=4), 1000, ["num_samples = 1000 must be in [1, 128]"]),
    ]
    for p, n, needles in bad:
        expect_sdk_error(lambda: sampler.sample(prompt, n, p).result(), *needles)
    expect_sdk_error(lambda: sc.create_sampling_client(
        model_path="tinker://nope/sampler_weights/x").result(),
        "tinker://nope/sampler_weights/x", "cannot be read", hidden=[server.state_dir])
    expect_sdk_error(lambda: tc.save_weights_for_sampler("s1").result(), "exist already")
    # The training client still works after the errors (no wedged seq_id).
    tc.forward_backward([datum(TEXTS[0])] * world, "cross_entropy").result()


def check_logprobs_and_stable_reinforce(server, world):
    """Issue 43 items 1 and 2 through the SDK: every logprob field of
    sample against the training model's forward (a full forward's
    log-softmax: within LOGPROB_TOLERANCE, other matmul shapes), in the
    SDK's shapes; then stable_reinforce on sequences sampled with
    record_stability_info, its loss the documented formula of the
    returned and sampled logprobs."""
    sc = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    tc = training_client(sc)
    for _ in range(2):
        tc.forward_backward([datum(t) for t in TEXTS[:2 * world]], "cross_entropy").result()
        tc.optim_step(adam()).result()
    sampler = sampling_client(tc.save_weights_and_get_sampling_client(
        record_stability_info=True))
    prompt_tokens = encode("the quick brown")
    n = len(prompt_tokens)
    prompt = types.ModelInput.from_ints(prompt_tokens)
    # The full distribution at every prompt position: all 256 ids as
    # targets (dense), which also gives the reference for the other fields.
    ids = np.tile(np.arange(256, dtype=np.int64), (n - 1, 1))
    full = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1),
                          include_prompt_logprobs=True,
                          target_prompt_logprobs=types.TensorData.from_numpy(ids)).result()
    dist = full.target_prompt_logprobs.to_numpy().reshape(n - 1, 256)
    assert np.allclose(np.log(np.exp(dist.astype(np.float64)).sum(1)), 0, atol=1e-5)
    # forward's logprob of each prompt token is the distribution's entry.
    ref = forward_logprobs(tc, [prompt_tokens])[0]
    got = dist[np.arange(n - 1), prompt_tokens[1:]]
    assert np.max(np.abs(got - ref)) < LOGPROB_TOLERANCE, (got, ref)
    # topk_prompt_logprobs with prompt_logprobs_last_n: None rows first.
    r = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=5),
                       include_prompt_logprobs=True, topk_prompt_logprobs=4,
                       topk_sample_logprobs=3, prompt_logprobs_last_n=5).result()
    top = r.topk_prompt_logprobs
    assert len(top) == n and all(row is None for row in top[:n - 5]), top
    for p in range(n - 5, n):
        want = np.argsort(-dist[p - 1], kind="stable")[:4]
        assert [t for t, _ in top[p]] == list(want), (p, top[p], want)
        assert np.allclose([lp for _, lp in top[p]], dist[p - 1][want], atol=1e-6)
    pl = r.prompt_logprobs
    assert all(x is None for x in pl[:n - 5]) and all(x is not None for x in pl[n - 5:]), pl
    # topk_sample_logprobs: one row per sampled token, the sampled one's
    # logprob within the row's range.
    for s in r.sequences:
        rows = s.topk_logprobs
        assert len(rows) == len(s.tokens), (rows, s.tokens)
        seq_ref = forward_logprobs(tc, [prompt_tokens + list(s.tokens)])[0]
        for i, row in enumerate(rows):
            assert len(row) == 3 and row[0][1] >= row[1][1] >= row[2][1], row
            assert row[0][1] >= seq_ref[n - 1 + i] - LOGPROB_TOLERANCE
    # target_prompt_logprobs sparse: the same layout back, -1 asks nothing.
    # (What TensorData.from_torch_sparse(ids, pad_value=-1) makes of a
    # [n - 1, 3] table of -1 with [2, 1] = 101 and [n - 2, 0] = 32.)
    crow = [0] * 3 + [1] * (n - 4) + [2]
    sparse = types.TensorData(data=[101, 32], dtype="int64", shape=[n - 1, 3],
                              sparse_crow_indices=crow, sparse_col_indices=[1, 0])
    tr = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1),
                        target_prompt_logprobs=sparse).result().target_prompt_logprobs
    assert tr.sparse_crow_indices is not None, tr
    assert np.allclose(tr.data, [dist[2][101], dist[n - 2][32]], atol=1e-6), tr
    # prompt_alt_tokens_k: k draws per position with their logprobs.
    alt = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=3),
                         prompt_alt_tokens_k=4).result().prompt_alt_tokens
    toks = alt.tokens.to_numpy().reshape(n - 1, 4)
    lps = alt.logprobs.to_numpy().reshape(n - 1, 4)
    assert np.allclose(lps, dist[np.arange(n - 1)[:, None], toks], atol=1e-6)
    # stable_reinforce on the recorded sequences (the rl_loop recipe's
    # datums); loss:sum = -sum(min(r, 1) * A * logp) over sampled tokens.
    data, qs, advs = [], [], []
    for i, s in enumerate(r.sequences):
        sampled = list(s.tokens)
        adv = 1.0 if i == 0 else -1.0
        d = types.Datum(
            model_input=prompt.append(types.EncodedTextChunk(tokens=sampled[:-1])),
            loss_fn_inputs={
                "target_tokens": np.array([0] * (n - 1) + sampled, dtype=np.int64),
                "logprobs": np.array([0.0] * (n - 1) + list(s.logprobs), dtype=np.float32),
                "advantages": np.array([0.0] * (n - 1) + [adv] * len(sampled), dtype=np.float32),
            },
        ).with_provenance(
            model_input=[types.PromptProvenanceSpan(sequence_id=s.sequence_id, length=n),
                         types.SampledProvenanceSpan(sequence_id=s.sequence_id,
                                                     length=len(sampled) - 1)],
            loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=s.sequence_id, offset=1,
                                                       length=n - 1),
                            types.SampledProvenanceSpan(sequence_id=s.sequence_id,
                                                        length=len(sampled))],
        )
        data.append(d)
        qs.append(np.array(s.logprobs, dtype=np.float64))
        advs.append(adv)
    out = tc.forward_backward(data, "stable_reinforce").result()
    expected = 0.0
    for o, q, adv in zip(out.loss_fn_outputs, qs, advs):
        lp = o["logprobs"].to_numpy().astype(np.float64)[n - 1:]
        expected += -float(np.sum(np.minimum(np.exp(lp - q), 1.0) * adv * lp))
    assert math.isclose(out.metrics["loss:sum"], expected, rel_tol=1e-4, abs_tol=1e-4), (
        out.metrics, expected)
    tc.optim_step(adam()).result()
    # A sequence this session never sampled: refused, naming it.
    bad = data[0].with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id="req-0:7", length=n),
                     types.SampledProvenanceSpan(sequence_id="req-0:7",
                                                 length=len(r.sequences[0].tokens) - 1)],
        loss_fn_inputs=data[0].loss_fn_input_spans)
    expect_sdk_error(lambda: tc.forward_backward([bad], "stable_reinforce").result(),
                     "'req-0:7', which this session has no record of")
    # Soft targets [T, K] whose weights come as the SDK's CSR (what it makes
    # of a 2-D torch tensor, the cookbook's self-distillation): the same
    # answer, bit for bit, as the dense weights.
    ids = np.array(encode(TEXTS[0]), dtype=np.int64)
    t = len(ids) - 1
    targets = np.stack([ids[1:], (ids[1:] + 1) % 256, (ids[1:] + 7) % 256], axis=1)
    w = np.zeros((t, 3), dtype=np.float32)
    w[:, 0] = 0.75
    w[::2, 2] = 0.25
    cols = [np.nonzero(row)[0] for row in w]
    csr = types.TensorData(data=w[w != 0], dtype="float32", shape=[t, 3],
                           sparse_crow_indices=np.cumsum([0] + [len(c) for c in cols]).tolist(),
                           sparse_col_indices=np.concatenate(cols).tolist())

    def soft(weights):
        return [types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()),
                            loss_fn_inputs={"target_tokens": targets, "weights": weights})] * world

    dense_out = tc.forward(soft(w), "cross_entropy").result()
    csr_out = tc.forward(soft(csr), "cross_entropy").result()
    assert dense_out.metrics["loss:sum"] == csr_out.metrics["loss:sum"], (
        dense_out.metrics, csr_out.metrics)
    for a, b in zip(dense_out.loss_fn_outputs, csr_out.loss_fn_outputs):
        assert np.array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
    sc.close("success").result()


def check_load(server):
    """A bounded loopback load test: nothing lost or reordered, and
    sampling under load is deterministic (load_test.py)."""
    import load_test  # beside this file

    load_test.run(server, requests=48, concurrency=8, datums=2, per_step=4)
    load_test.run_sampling(server, requests=24, concurrency=4, num_samples=4, max_tokens=16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--launch", default="", help="tools/launch: adds the gloo scenarios")
    ap.add_argument("--make-hf-model", default="",
                    help="tools:make_hf_model: adds the Hugging Face folder scenarios")
    args = ap.parse_args()
    print("tinker SDK", tinker.__version__)
    fd, stage3_config = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}, f)
    scenarios = [
        ("world1-stage0", ["--world=1", "--stage=0"], check_training, 1),
        ("world2-stage2", ["--world=2", "--stage=2"], check_training, 2),
        # Persistence threshold 0: every block's LoRA adapters form a stage 3
        # group gathered around frozen base weights.
        ("world2-stage3", ["--world=2", "--config=" + stage3_config], check_training, 2),
        ("load-world2-stage2", ["--world=2", "--stage=2"], check_load, None),
        ("bad-input-world2-stage2",
         ["--world=2", "--stage=2", "--seq-gap-timeout-s=1", "--long-poll-s=2"],
         check_bad_input, None),
        ("sampling-world1-stage0", ["--world=1", "--stage=0"], check_sampling, 1),
        # Issue 43: every sample field and stable_reinforce, at stage 3.
        ("logprobs-world2-stage3", ["--world=2", "--config=" + stage3_config],
         check_logprobs_and_stable_reinforce, 2),
        # Stage 3: the snapshot gathers the partitioned parameters.
        ("sampling-world2-stage3", ["--world=2", "--config=" + stage3_config],
         check_sampling, 2),
        ("robustness-world1", ["--world=1", "--stage=0"],
         lambda server: check_robustness(server, args.server), None),
    ]
    if args.launch:
        scenarios.append(("gloo-2-processes-stage2", ["--backend=gloo", "--stage=2"],
                          check_training, 2))
    if args.make_hf_model:
        # Issue 40: a Hugging Face folder trains with LoRA, saves and loads
        # its state and serves every loss exactly as the toys do, at every
        # stage, on simulated and Gloo ranks. Random tiny folders (vocabulary
        # 256, so the byte-level texts are token ids): a tied Llama and an
        # untied Qwen3 (its lm_head a stage 3 group of its own).
        work = tempfile.mkdtemp(prefix="e2e_hf_")
        folders = {}
        for name, extra in [("llama", ["--tied"]), ("qwen3", [])]:
            folders[name] = os.path.join(work, name)
            subprocess.run([args.make_hf_model, "--out=" + folders[name], "--preset=tiny",
                            "--arch=" + name, "--seed=5", *extra], check=True)
        for name, folder, flags, world in [
                ("hf-llama-world2-stage0", folders["llama"], ["--world=2", "--stage=0"], 2),
                ("hf-qwen3-world2-stage1", folders["qwen3"], ["--world=2", "--stage=1"], 2),
                ("hf-llama-world3-stage2", folders["llama"], ["--world=3", "--stage=2"], 3),
                ("hf-qwen3-world2-stage3", folders["qwen3"],
                 ["--world=2", "--config=" + stage3_config], 2)]:
            scenarios.append((name, flags + ["--model=%s=%s" % (name, folder)],
                              lambda server, world, base=name: check_training(server, world, base, **HF_FIT),
                              world))
        if args.launch:
            scenarios.append(("gloo-hf-qwen3-2-processes-stage3",
                              ["--backend=gloo", "--config=" + stage3_config,
                               "--model=gloo-hf-qwen3=%s" % folders["qwen3"]],
                              lambda server, world: check_training(server, world, "gloo-hf-qwen3", **HF_FIT),
                              2))

    def scenario(name, flags, fn, world):
        launch = (args.launch, world) if name.startswith("gloo") else None
        server = Server(args.server, *flags, launch=launch)
        try:
            if world is None:
                fn(server)
            else:
                fn(server, world)
            # SIGTERM stops every rank gracefully: exit status 0.
            code = server.stop()
            assert code == 0, "the server's exit status after SIGTERM: %r" % code
        finally:
            server.stop()

    return local_server.run_scenarios(
        [(s[0], lambda s=s: scenario(*s)) for s in scenarios], args.only)

if __name__ == "__main__":
    sys.exit(main())
