"""Issue 45 through the official tinker SDK: API keys, tenants, quotas.

Run by tools/tinker/e2e_test.sh inside the pinned SDK's virtual environment:

    python tenants_test.py --server=PATH/trainer_server [--only=NAME]

Each scenario starts a server with a keys file (--api-keys) on a free
loopback port, drives it with the SDK (and raw HTTP where the SDK cannot
say it), and stops it with SIGTERM (exit status 0 expected):
  - two-tenants: alice and bob train at once, with the same base model,
    seed and checkpoint names; neither can read, list, sample, load, delete
    or overwrite the other's, and every such attempt is answered exactly
    as for a run or path that does not exist;
  - keys: a missing, wrong or revoked key gets 401 with a JSON body (the
    SDK raises AuthenticationError) before any work;
  - rotation: a key rotated in the file takes effect without a restart
    (--api-keys-reload-s), the new key sees the tenant's models, and a
    request of the old key that was in flight finishes;
  - quotas: max_models (HTTP 403, nothing created) and max_bytes (the
    save fails, nothing written).
No assertion is on time: waits are bounded (their messages say a hang).
"""

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_test  # noqa: E402  (datum, adam, TEXTS, BASE)
import local_server  # noqa: E402
import tinker  # noqa: E402
from tinker import types  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)

ALICE = "tml-alice-" + "a" * 22
ALICE_NEW = "tml-alice-" + "n" * 22
BOB = "tml-bob-" + "b" * 24
CAROL = "tml-carol-" + "c" * 22
KEYS = [(ALICE, "alice"), (BOB, "bob max_models=2")]


def write_keys(path, entries):
    """Writes the keys file whole, under another name renamed into place
    (as an editor or a deploy tool does)."""
    with open(path + ".tmp", "w") as f:
        f.write("# issue 45 test keys\n")
        for key, rest in entries:
            f.write("%s %s\n" % (key, rest))
    os.chmod(path + ".tmp", 0o600)
    os.replace(path + ".tmp", path)


class Server(e2e_test.Server):
    """A server with a keys file; raw() for requests with any key."""

    def __init__(self, binary, keys, *args):
        self.keys_file = os.path.join(tempfile.mkdtemp(prefix="zerostep-keys-"), "keys")
        write_keys(self.keys_file, keys)
        super().__init__(binary, "--api-keys=" + self.keys_file, *args, merge_stderr=True)

    def raw(self, method, endpoint, body=None, key=None, headers=None):
        """(status, parsed JSON or raw bytes) of one HTTP request."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + "/api/v1/" + endpoint, data=data,
                                     method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("X-API-Key", key)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw


def error_text(fn):
    """fn() raises; the exception's type name and message."""
    try:
        fn()
    except Exception as e:  # the SDK's errors
        return type(e).__name__, str(e)
    raise AssertionError("no error raised")


def same_as_missing(theirs, none, their_id, missing_id, what):
    """Two (type, message) errors are the same once the ids are replaced
    (and the SDK's own request ids, which differ by request)."""
    def norm(text, the_id):
        return re.sub(r"req-[0-9]+", "req-N", text.replace(the_id, "<id>"))
    a = (theirs[0], norm(theirs[1], their_id))
    b = (none[0], norm(none[1], missing_id))
    assert a == b, "%s: another tenant's is told apart from a missing one:\n  %r\n  %r" % (
        what, a, b)
    print("  %s: %s" % (what, a[1][:140]))


def train(sc, steps, out, name):
    """Trains a LoRA client for `steps`, saves a checkpoint and sampler
    weights named as every tenant names them; records ids and digests."""
    tc = sc.create_lora_training_client(base_model=e2e_test.BASE, rank=4, seed=7).result()
    data = [e2e_test.datum(t) for t in e2e_test.TEXTS[:4]]
    for _ in range(steps):
        tc.forward_backward(data, "cross_entropy").result()
        metrics = tc.optim_step(e2e_test.adam()).result().metrics
    out[name] = {
        "tc": tc,
        "model_id": tc.model_id,
        "digest": e2e_test.optim_digest(metrics),
        "path": tc.save_state("run-1").result().path,
        "sampler": tc.save_weights_for_sampler("s1").result().path,
    }


def check_two_tenants(binary):
    server = Server(binary, KEYS, "--world=2", "--stage=2")
    try:
        sc = {k: tinker.ServiceClient(base_url=server.url, api_key=key)
              for k, key in [("alice", ALICE), ("bob", BOB)]}
        got, errors = {}, []

        def run(name, steps):
            try:
                train(sc[name], steps, got, name)
            except Exception:
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=run, args=("alice", 3)),
                   threading.Thread(target=run, args=("bob", 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        a, b = got["alice"], got["bob"]
        assert a["model_id"] != b["model_id"]
        assert a["path"].endswith("/weights/run-1") and b["path"].endswith("/weights/run-1")
        # The same names, two folders.
        root = os.path.join(server.state_dir, "tenants")
        assert sorted(os.listdir(root)) == ["alice", "bob"], os.listdir(root)
        missing = a["path"].replace(a["model_id"], "session-nobody-1:train:0")
        missing_sampler = a["sampler"].replace(a["model_id"], "session-nobody-1:train:0")
        missing_run = "session-nobody-1:train:0"

        # Read: bob cannot load, sample or restore alice's, and is told so
        # exactly as for a path nobody has.
        same_as_missing(
            error_text(lambda: sc["bob"].create_training_client_from_state(a["path"]).get_info()),
            error_text(lambda: sc["bob"].create_training_client_from_state(missing).get_info()),
            a["model_id"], "session-nobody-1:train:0", "create_training_client_from_state")
        same_as_missing(
            error_text(lambda: b["tc"].load_state(a["path"]).result()),
            error_text(lambda: b["tc"].load_state(missing).result()),
            a["model_id"], "session-nobody-1:train:0", "load_state")
        same_as_missing(
            error_text(lambda: sc["bob"].create_sampling_client(model_path=a["sampler"]).sample(
                types.ModelInput.from_ints([1, 2]), 1,
                types.SamplingParams(max_tokens=2)).result()),
            error_text(lambda: sc["bob"].create_sampling_client(model_path=missing_sampler).sample(
                types.ModelInput.from_ints([1, 2]), 1,
                types.SamplingParams(max_tokens=2)).result()),
            a["model_id"], "session-nobody-1:train:0", "create_sampling_client")

        # List: each sees its own checkpoints only; alice's run is a 404
        # for bob, as a run nobody has.
        rest = {k: sc[k].create_rest_client() for k in sc}
        for name, mine in [("alice", a), ("bob", b)]:
            listed = rest[name].list_user_checkpoints().result()
            paths = sorted(c.tinker_path for c in listed.checkpoints)
            assert paths == sorted([mine["path"], mine["sampler"]]), (name, paths)
            assert listed.cursor.total_count == 2, listed.cursor
            run = rest[name].list_checkpoints(mine["model_id"]).result()
            assert sorted(c.checkpoint_id for c in run.checkpoints) == [
                "sampler_weights/s1", "weights/run-1"], run
            assert all(c.size_bytes > 0 for c in run.checkpoints), run
        same_as_missing(
            error_text(lambda: rest["bob"].list_checkpoints(a["model_id"]).result()),
            error_text(lambda: rest["bob"].list_checkpoints(missing_run).result()),
            a["model_id"], missing_run, "list_checkpoints")

        # Overwrite or delete: bob's requests naming alice's run are
        # answered as for a run nobody has, and change nothing of hers.
        same_as_missing(
            error_text(lambda: rest["bob"].delete_checkpoint_from_tinker_path(
                a["path"]).result()),
            error_text(lambda: rest["bob"].delete_checkpoint_from_tinker_path(missing).result()),
            a["model_id"], "session-nobody-1:train:0", "delete_checkpoint")
        for ep, body in [
            ("save_weights", {"seq_id": 100, "path": "run-1", "overwrite": True}),
            ("optim_step", {"seq_id": 100, "adam_params": {"learning_rate": 0.5}}),
        ]:
            theirs = server.raw("POST", ep, dict(body, model_id=a["model_id"]), key=BOB)
            none = server.raw("POST", ep, dict(body, model_id=missing_run), key=BOB)
            assert theirs[0] == none[0] == 200, (theirs, none)
            results = []
            for r, mid in [(theirs, a["model_id"]), (none, missing_run)]:
                while True:
                    s, res = server.raw("POST", "retrieve_future",
                                        {"request_id": r[1]["request_id"]}, key=BOB)
                    assert s == 200, (s, res)
                    if res.get("type") != "try_again":
                        break
                results.append(json.dumps(res).replace(mid, "<id>"))
            assert results[0] == results[1] and "unknown model_id" in results[0], results
            print("  %s of alice's model: %s" % (ep, results[0][:120]))
        status, info = server.raw("POST", "get_info", {"model_id": a["model_id"]}, key=BOB)
        status2, info2 = server.raw("POST", "get_info", {"model_id": missing_run}, key=BOB)
        assert status == status2 == 404, (status, info, status2, info2)
        # alice's run is whole: her checkpoint loads to her digest.
        restored = sc["alice"].create_training_client_from_state(a["path"])
        assert server.raw("POST", "get_info", {"model_id": restored.model_id},
                          key=ALICE)[1]["param_digest"] == a["digest"]
        assert len(rest["alice"].list_user_checkpoints().result().checkpoints) == 2
        # Her own delete works.
        rest["alice"].delete_checkpoint_from_tinker_path(a["sampler"]).result()
        assert [c.tinker_path for c in rest["alice"].list_user_checkpoints().result()
                .checkpoints] == [a["path"]]
        assert server.stop() == 0
    finally:
        server.stop()


def check_keys(binary):
    server = Server(binary, KEYS)
    try:
        for key, what in [(None, "missing API key"), ("tml-wrong-" + "x" * 22, "invalid API key"),
                          (CAROL, "invalid API key")]:
            for method, ep, body in [("POST", "create_session", {}),
                                     ("GET", "get_server_capabilities", None),
                                     ("POST", "create_model", {"base_model": e2e_test.BASE})]:
                status, answer = server.raw(method, ep, body, key=key)
                assert status == 401, (key, ep, status, answer)
                assert what in answer["error"] and answer["category"] == "user", answer
                if key:
                    assert key not in json.dumps(answer)
        kind, message = error_text(lambda: tinker.ServiceClient(
            base_url=server.url, api_key="tml-wrong-" + "x" * 22).get_server_capabilities())
        assert kind == "AuthenticationError" and "401" in message, (kind, message)
        print("  SDK with a wrong key:", kind, message[:120])
        # healthz answers without a key (load balancers' probes).
        assert server.raw("GET", "healthz") == (200, {"status": "ok"})
        # Nothing was created by the refused requests.
        assert not os.path.exists(os.path.join(server.state_dir, "tenants"))
        # No key in the server's log.
        assert server.stop() == 0
    finally:
        server.stop()
    log = "".join(server.lines)
    assert "refused" in log and "401" in log, log[-2000:]
    for key in [ALICE, BOB, CAROL, "tml-wrong-" + "x" * 22]:
        assert key not in log, "a key in the server's log"


def check_rotation(binary):
    server = Server(binary, KEYS, "--api-keys-reload-s=0.2", "--long-poll-s=60")
    try:
        sc = tinker.ServiceClient(base_url=server.url, api_key=ALICE)
        tc = sc.create_lora_training_client(base_model=e2e_test.BASE, rank=4, seed=7).result()
        model = tc.model_id
        # An in-flight request of the old key: a long poll on seq_id 2 of
        # the model, held (by the server) until seq_id 1 arrives.
        step = server.raw("POST", "optim_step",
                          {"model_id": model, "seq_id": 2,
                           "adam_params": {"learning_rate": 0.01}}, key=ALICE)
        assert step[0] == 200, step
        polled = {}

        def poll():
            polled["answer"] = server.raw("POST", "retrieve_future",
                                          {"request_id": step[1]["request_id"]}, key=ALICE)

        poller = threading.Thread(target=poll)
        poller.start()
        # Rotation: the old key out, a new one for alice in.
        write_keys(server.keys_file, [(ALICE_NEW, "alice"), (BOB, "bob")])
        for _ in range(600):  # 0.1 s apart: 60 s means the reload never came
            if server.raw("GET", "get_server_capabilities", key=ALICE)[0] == 401:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the old key still works 60 s after the file "
                                 "changed: the reload (0.2 s) never came")
        assert poller.is_alive(), "the in-flight poll ended before its request ran"
        # The new key acts for alice: her model, and the request that
        # completes the held one.
        status, _, raw = server.post("forward_backward",
                                     e2e_test.fb_body(model, 1, e2e_test.TEXTS[:2]),
                                     "application/x-protobuf", key=ALICE_NEW)
        assert status == 200, raw
        poller.join(120)
        assert not poller.is_alive(), "the in-flight poll never answered (a hang)"
        status, answer = polled["answer"]
        assert status == 200 and "metrics" in answer, (status, answer)
        print("  the old key's in-flight request finished:", json.dumps(answer)[:100])
        # The SDK: the old key is refused, the new one sees alice's model.
        kind, message = error_text(lambda: tinker.ServiceClient(
            base_url=server.url, api_key=ALICE).get_server_capabilities())
        assert kind == "AuthenticationError", (kind, message)
        sc_new = tinker.ServiceClient(base_url=server.url, api_key=ALICE_NEW)
        status, info = server.raw("POST", "get_info", {"model_id": model}, key=ALICE_NEW)
        assert status == 200 and info["global_steps"] == 1, (status, info)
        tc_new = sc_new.create_lora_training_client(base_model=e2e_test.BASE, rank=4).result()
        tc_new.forward_backward([e2e_test.datum(e2e_test.TEXTS[0])], "cross_entropy").result()
        # bob's key was not touched.
        assert server.raw("GET", "get_server_capabilities", key=BOB)[0] == 200
        # A broken file keeps the keys it replaced (logged), an empty one
        # revokes every key.
        with open(server.keys_file, "w") as f:
            f.write("tml-short alice\n")
        time.sleep(1.0)  # several reloads: the keys must still be there
        assert server.raw("GET", "get_server_capabilities", key=BOB)[0] == 200
        write_keys(server.keys_file, [])
        for _ in range(600):
            if server.raw("GET", "get_server_capabilities", key=BOB)[0] == 401:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("an emptied keys file revoked nothing in 60 s (a hang)")
        assert server.stop() == 0
    finally:
        server.stop()
    log = "".join(server.lines)
    assert "changed: alice (1 key), bob (1 key)" in log, log[-3000:]
    assert "keeping the 2 keys read before" in log, log[-3000:]
    assert "changed: no keys: every request is refused" in log, log[-3000:]
    for key in [ALICE, ALICE_NEW, BOB]:
        assert key not in log, "a key in the server's log"


def check_quotas(binary):
    server = Server(binary, [(ALICE, "alice"), (BOB, "bob max_models=1"),
                             (CAROL, "carol max_bytes=40K")],
                    "--tenant-max-models=3")
    try:
        bob = tinker.ServiceClient(base_url=server.url, api_key=BOB)
        first = bob.create_lora_training_client(base_model=e2e_test.BASE, rank=4).result()
        kind, message = error_text(
            lambda: bob.create_lora_training_client(base_model=e2e_test.BASE, rank=4).result())
        assert kind == "PermissionDeniedError" and "403" in message, (kind, message)
        assert "tenant 'bob' holds 1 model, its quota (max_models=1" in message, message
        print("  max_models:", message[:160])
        first.forward_backward([e2e_test.datum(e2e_test.TEXTS[0])], "cross_entropy").result()
        # alice has the server's default quota (--tenant-max-models=3).
        alice = tinker.ServiceClient(base_url=server.url, api_key=ALICE)
        for _ in range(3):
            alice.create_lora_training_client(base_model=e2e_test.BASE, rank=2).result()
        kind, message = error_text(
            lambda: alice.create_lora_training_client(base_model=e2e_test.BASE, rank=2).result())
        assert kind == "PermissionDeniedError" and "max_models=3" in message, message
        # max_bytes: carol's first checkpoint fits, the second does not;
        # nothing of the refused one is written, and a delete makes room.
        carol = tinker.ServiceClient(base_url=server.url, api_key=CAROL)
        tc = carol.create_lora_training_client(base_model=e2e_test.BASE, rank=1).result()
        kept = tc.save_state("first").result().path
        folder = os.path.join(server.state_dir, "tenants", "carol")
        held = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, files in os.walk(folder) for f in files)
        kind, message = error_text(lambda: tc.save_state("second").result())
        assert "over its quota of 40960 bytes (max_bytes" in message, (kind, message)
        assert "Nothing was written" in message, message
        print("  max_bytes:", message[:200])
        assert sum(os.path.getsize(os.path.join(d, f))
                   for d, _, files in os.walk(folder) for f in files) == held
        rest = carol.create_rest_client()
        assert [c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints] == [kept]
        rest.delete_checkpoint_from_tinker_path(kept).result()
        tc.save_state("second").result()
        assert server.stop() == 0
    finally:
        server.stop()


SCENARIOS = [
    ("two-tenants", check_two_tenants),
    ("keys", check_keys),
    ("rotation", check_rotation),
    ("quotas", check_quotas),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    print("tinker SDK", tinker.__version__)
    return local_server.run_scenarios(
        [(name, lambda fn=fn: fn(args.server)) for name, fn in SCENARIOS], args.only)

if __name__ == "__main__":
    sys.exit(main())
