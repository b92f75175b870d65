"""Loopback load test of //tools:trainer_server's forward_backward.

    python load_test.py --server=PATH/trainer_server [--requests=400]
        [--concurrency=8] [--datums=2] [--per-step=4] [--world=1] [--stage=0]

Bounded in count (--requests forward_backward requests, an optim_step after
every --per-step of them) and in time (every request must finish within
60 s). C client threads post a model's requests with consecutive seq_ids,
each thread taking the next request as soon as its previous one finished,
so requests arrive out of order and in bursts; the server must run them in
seq_id order. Checks:
  - no request lost: every future resolves, and every one succeeds (an
    optim_step that overtook its forward_backward would fail with "no
    forward_backward since the last optim_step");
  - no request reordered: the parameters after the run equal, bit for bit,
    those of a twin model driven one request at a time in order.
Reports forward_backward requests/s and p50/p99 latency (post to result,
as the client sees it) as one JSON line.

With --sampling, the same for asample instead (run_sampling): C threads
post --requests sample requests (--num-samples samples of --max-tokens
tokens each, seeded by the request's index) to one sampling session of a
trained model. Checks: every request succeeds with the tokens asked for,
and a second, sequential pass over some requests repeats their tokens (same
seed, same tokens). Reports sample requests/s, generated tokens/s and
p50/p99 latency.

Run with the virtual environment tools/tinker/e2e_test.sh builds (it uses
the SDK's protobuf module to encode requests).
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_test  # noqa: E402  (Server, fb_body, TEXTS)


def _plan(requests, per_step, datums):
    """[(seq_id, kind, payload)] for one model."""
    items, seq, fb_count = [], 0, 0
    while fb_count < requests:
        seq += 1
        texts = [e2e_test.TEXTS[(fb_count * datums + i) % len(e2e_test.TEXTS)]
                 for i in range(datums)]
        items.append((seq, "fb", texts))
        fb_count += 1
        if fb_count % per_step == 0 or fb_count == requests:
            seq += 1
            items.append((seq, "optim", None))
    return items


def _send(server, model_id, item):
    seq, kind, texts = item
    if kind == "fb":
        status, _, raw = server.post("forward_backward", e2e_test.fb_body(model_id, seq, texts),
                                     "application/x-protobuf")
    else:
        status, _, raw = server.post("optim_step", {"model_id": model_id, "seq_id": seq,
                                                    "adam_params": {"learning_rate": 0.01}})
    assert status == 200, (status, raw)
    return json.loads(raw)["request_id"]


def _create(server, seq):
    status, body = server.post_json("create_model", {
        "session_id": server.session(), "model_seq_id": seq, "base_model": e2e_test.BASE,
        "lora_config": {"rank": 4, "seed": 1}})
    assert status == 200, body
    kind, res = server.result(body["request_id"])
    assert kind == "json", res
    return body["model_id"]


def run(server, requests=400, concurrency=8, datums=2, per_step=4):
    items = _plan(requests, per_step, datums)
    model, twin = _create(server, 0), _create(server, 1)
    latencies, failures = [], []
    lock = threading.Lock()
    cursor = [0]

    def worker():
        while True:
            with lock:
                if cursor[0] >= len(items):
                    return
                item = items[cursor[0]]
                cursor[0] += 1
            t0 = time.perf_counter()
            try:
                kind, res = server.result(_send(server, model, item))
            except Exception as e:  # noqa: BLE001 - reported below
                kind, res = "error", {"error": repr(e)}
            dt = time.perf_counter() - t0
            with lock:
                if kind == "error":
                    failures.append((item[0], item[1], res))
                elif item[1] == "fb":
                    latencies.append(dt)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60 + 0.5 * len(items))
    wall = time.perf_counter() - start
    assert not any(t.is_alive() for t in threads), "requests still pending: bounded time exceeded"
    assert not failures, failures[:5]
    assert len(latencies) == requests, (len(latencies), requests)

    # The twin, one request at a time, in order.
    for item in items:
        kind, res = server.result(_send(server, twin, item))
        assert kind != "error", res
    assert server.digest(model) == server.digest(twin), "a reordered request changed the result"

    latencies.sort()
    pct = lambda p: latencies[min(len(latencies) - 1, int(p / 100.0 * len(latencies)))]
    report = {
        "forward_backward_requests": requests,
        "optim_steps": len(items) - requests,
        "concurrency": concurrency,
        "datums_per_request": datums,
        "requests_per_s": round(requests / wall, 1),
        "p50_ms": round(1000 * pct(50), 2),
        "p99_ms": round(1000 * pct(99), 2),
        "lost": 0,
        "reordered": 0,
    }
    print("load_test " + json.dumps(report), flush=True)
    return report


def _post_sample(server, session, index, num_samples, max_tokens):
    prompt = list(e2e_test.TEXTS[index % len(e2e_test.TEXTS)][:8].encode())
    status, _, raw = server.post("asample", {
        "sampling_session_id": session, "seq_id": index, "num_samples": num_samples,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
        "sampling_params": {"max_tokens": max_tokens, "seed": index, "temperature": 1.0}})
    assert status == 200, (status, raw)
    body = json.loads(raw)
    assert len(body["sample_sequence_ids"]) == num_samples, body
    return body["request_id"]


def _sample_tokens(server, request_id):
    kind, res = server.result(request_id, proto=e2e_test.pb.SampleResponse)
    if kind != "proto":
        return kind, res
    return kind, [bytes(s.tokens) for s in res.sequences]


def run_sampling(server, requests=200, concurrency=8, num_samples=4, max_tokens=32):
    model = _create(server, 2)  # run() uses 0 and 1
    # Train one step so the sampler's LoRA adapters are not zero.
    for seq, kind, payload in _plan(1, 1, 2):
        kind_res = server.result(_send(server, model, (seq, kind, payload)))
        assert kind_res[0] != "error", kind_res
    status, body = server.post_json("save_weights_for_sampler", {
        "model_id": model, "seq_id": 3, "sampling_session_seq_id": 0})
    assert status == 200, body
    kind, res = server.result(body["request_id"])
    assert kind == "json", res
    session = res["sampling_session_id"]

    latencies, failures, results = [], [], {}
    lock = threading.Lock()
    cursor = [0]

    def worker():
        while True:
            with lock:
                if cursor[0] >= requests:
                    return
                index = cursor[0]
                cursor[0] += 1
            t0 = time.perf_counter()
            try:
                kind, res = _sample_tokens(
                    server, _post_sample(server, session, index, num_samples, max_tokens))
            except Exception as e:  # noqa: BLE001 - reported below
                kind, res = "error", {"error": repr(e)}
            dt = time.perf_counter() - t0
            with lock:
                if kind != "proto":
                    failures.append((index, res))
                else:
                    latencies.append(dt)
                    results[index] = res

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60 + 0.5 * requests)
    wall = time.perf_counter() - start
    assert not any(t.is_alive() for t in threads), "requests still pending: bounded time exceeded"
    assert not failures, failures[:5]
    assert len(latencies) == requests, (len(latencies), requests)
    for tokens in results.values():
        assert len(tokens) == num_samples and all(len(t) == 4 * max_tokens for t in tokens)

    # Same seed, same tokens: a sequential second pass over some requests
    # (new seq_ids, the same seeds and prompts).
    for index in range(0, requests, max(1, requests // 8)):
        status, _, raw = server.post("asample", {
            "sampling_session_id": session, "seq_id": requests + index,
            "num_samples": num_samples,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(
                e2e_test.TEXTS[index % len(e2e_test.TEXTS)][:8].encode())}]},
            "sampling_params": {"max_tokens": max_tokens, "seed": index, "temperature": 1.0}})
        assert status == 200, raw
        kind, again = _sample_tokens(server, json.loads(raw)["request_id"])
        assert kind == "proto" and again == results[index], ("not deterministic", index)

    latencies.sort()
    pct = lambda p: latencies[min(len(latencies) - 1, int(p / 100.0 * len(latencies)))]
    report = {
        "sample_requests": requests,
        "concurrency": concurrency,
        "num_samples": num_samples,
        "max_tokens": max_tokens,
        "requests_per_s": round(requests / wall, 1),
        "tokens_per_s": round(requests * num_samples * max_tokens / wall, 1),
        "p50_ms": round(1000 * pct(50), 2),
        "p99_ms": round(1000 * pct(99), 2),
        "failed": 0,
    }
    print("load_test_sampling " + json.dumps(report), flush=True)
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--datums", type=int, default=2)
    ap.add_argument("--per-step", type=int, default=4)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--sampling", action="store_true", help="asample instead of training")
    ap.add_argument("--num-samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    server = e2e_test.Server(args.server, "--world=%d" % args.world, "--stage=%d" % args.stage)
    try:
        if args.sampling:
            report = run_sampling(server, args.requests, args.concurrency, args.num_samples,
                                  args.max_tokens)
        else:
            report = run(server, args.requests, args.concurrency, args.datums, args.per_step)
        report.update({"world": args.world, "stage": args.stage})
        print(json.dumps(report))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
