#!/usr/bin/env python3
"""Hostile clients against //tools:trainer_server on loopback (issue 45).

    hostile_test.py SERVER_BINARY [--rounds=3]

Standard library only. A server with a keys file and small limits
(--max-connections=64, --max-connections-per-client=16,
--idle-timeout-s=1, --header-timeout-s=1, --read-timeout-s=2,
--max-body-bytes=1M) takes, in each round, from attackers at 127.0.0.1
and 127.0.0.3-8 (loopback addresses: other clients to the server):
  - a flood of idle connections (64 from each of 4 addresses, 4x the
    server's limit; none sends a byte);
  - slow-loris heads (a byte of the head every 0.25 s);
  - slow bodies from a client with a valid key (Content-Length 100000, 10
    bytes sent);
  - oversized uploads (Content-Length 1 GiB, with and without a key; and 4
    MiB actually sent against the 1 MiB limit);
  - heads larger than 16 KiB.
all at once, then the slow heads again beside the slow bodies alone. Each
is answered as Note [Bounded HTTP] in tools/tinker/http.h says (a close,
408, 401, 413, 431), while a prober thread at 127.0.0.2 asks
healthz on a new connection every 50 ms and must get every answer. After the rounds, an
authenticated request is served, the server's resident memory has not
grown past the first round's by more than 24 MiB (memory flat), and
SIGTERM stops it with status 0. Every wait is bounded: a bound that runs
out is reported as a hang, never as slowness.
"""

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import local_server  # noqa: E402

KEY = "tml-hostile-test-" + "k" * 16
LIMITS = ["--max-connections=64", "--max-connections-per-client=16", "--idle-timeout-s=1",
          "--header-timeout-s=1", "--read-timeout-s=2", "--max-body-bytes=1M"]
HANG_S = 30  # 10x and more the largest limit: reaching it means a hang


class Server(local_server.ServerProcess):
    """The server with a keys file and the LIMITS (tools/tinker/local_server.py)."""

    def __init__(self, binary):
        self.keys_dir = tempfile.mkdtemp(prefix="zerostep-hostile-")
        keys = os.path.join(self.keys_dir, "keys")
        with open(keys, "w") as f:
            f.write(KEY + " hostile-test\n")
        os.chmod(keys, 0o600)
        super().__init__(binary, "--api-keys=" + keys, *LIMITS, merge_stderr=True)
        self.port = int(self.url.rsplit(":", 1)[1])

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def connect(self, source="127.0.0.1"):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=HANG_S,
                                     source_address=(source, 0))
        s.settimeout(HANG_S)
        return s

    def stop(self):
        code = super().stop()
        shutil.rmtree(self.keys_dir, ignore_errors=True)
        return code


def read_answer(s):
    """(status, body) of one response, or (0, b"") if the server closed
    the connection first."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return 0, b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(head.split()[1]), body
    except ConnectionResetError:
        return 0, b""
    except socket.timeout:
        raise AssertionError("no answer within %d s: the server hangs" % HANG_S)


def closed(s):
    """True once the server has closed `s` (reading what it sent first)."""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        raise AssertionError("a connection the limits should end stayed open "
                             "%d s: the server hangs" % HANG_S)


class Prober(threading.Thread):
    """healthz on a fresh connection every 50 ms; counts answers and
    failures."""

    def __init__(self, server):
        super().__init__()
        self.server, self.stop_flag = server, threading.Event()
        self.ok, self.failures = 0, []

    def run(self):
        while not self.stop_flag.is_set():
            try:
                s = self.server.connect("127.0.0.2")
                s.sendall(b"GET /api/v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                status, body = read_answer(s)
                s.close()
                if status == 200 and json.loads(body) == {"status": "ok"}:
                    self.ok += 1
                else:
                    self.failures.append((status, body[:100]))
            except (OSError, AssertionError) as e:
                self.failures.append(repr(e))
            time.sleep(0.05)


def idle_flood(server):
    socks = [server.connect(source) for _ in range(64)
             for source in ["127.0.0.1", "127.0.0.3", "127.0.0.4", "127.0.0.5"]]
    ended = sum(closed(s) for s in socks)  # evicted, or closed at idle-timeout
    for s in socks:
        s.close()
    assert ended == len(socks), ended
    return "%d idle connections all closed by the server" % ended


def slow_loris(server):
    head = b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40
    socks = [server.connect("127.0.0.6") for _ in range(32)]
    answers = []
    for i in range(len(head)):
        for s in list(socks):
            try:
                s.sendall(head[i:i + 1])
            except OSError:  # closed by the server: expected in the end
                socks.remove(s)
                answers.append(read_answer(s)[0])
                s.close()
        if not socks:
            break
        time.sleep(0.25)
    for s in socks:
        answers.append(read_answer(s)[0])
        s.close()
    # Each ends: 408 at --header-timeout-s, or closed sooner to make room
    # for newer connections (its own beyond --max-connections-per-client,
    # anyone's beyond --max-connections).
    assert all(a in (408, 0) for a in answers), answers
    return "%d slow heads ended: %d answered 408, the others closed" % (
        len(answers), answers.count(408))


def slow_bodies(server):
    socks = []
    for _ in range(16):
        s = server.connect("127.0.0.7")
        s.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
                  KEY.encode() + b"\r\nContent-Length: 100000\r\n\r\n" + b"{" * 10)
        socks.append(s)
    statuses = [read_answer(s)[0] for s in socks]
    for s in socks:
        assert closed(s)
        s.close()
    assert statuses == [408] * len(socks), statuses
    return "%d slow bodies answered 408 and closed" % len(statuses)


def oversized(server):
    out = []
    for key, want in [(None, 401), (KEY, 413)]:
        s = server.connect("127.0.0.8")
        head = b"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\n"
        if key:
            head += b"X-API-Key: " + key.encode() + b"\r\n"
        s.sendall(head + b"Content-Length: 1073741824\r\n\r\n")
        status, body = read_answer(s)
        assert status == want, (status, body)
        assert closed(s)
        s.close()
        out.append(status)
    # 4 MiB really sent against a 1 MiB limit: refused, and the server
    # stops reading (the rest of the upload fails or is dropped).
    s = server.connect("127.0.0.8")
    s.sendall(b"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
              KEY.encode() + b"\r\nContent-Length: 4194304\r\n\r\n")
    try:
        for _ in range(64):
            s.sendall(b"\0" * 65536)
    except OSError:
        pass
    status, _ = read_answer(s)
    assert status in (413, 0), status
    s.close()
    # A head over 16 KiB.
    s = server.connect("127.0.0.8")
    try:
        s.sendall(b"GET /api/v1/healthz HTTP/1.1\r\nX-Pad: " + b"p" * 40000 + b"\r\n\r\n")
    except OSError:
        pass
    status, _ = read_answer(s)
    assert status in (431, 0), status
    s.close()
    return "oversized: 1 GiB announced -> %s, 4 MiB sent -> refused, 40 KB head -> %s" % (
        out, status)


def authenticated_request(server):
    s = server.connect("127.0.0.2")
    s.sendall(b"GET /api/v1/get_server_capabilities HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
              KEY.encode() + b"\r\n\r\n")
    status, body = read_answer(s)
    s.close()
    assert status == 200 and b"supported_models" in body, (status, body)


def run_together(server, attacks, results):
    """Runs each attack on a thread of its own; raises if any failed."""
    threads, errors = [], []
    for attack in attacks:
        def run(fn=attack):
            try:
                results.append(fn(server))
            except Exception:  # reported below
                import traceback
                errors.append("%s: %s" % (fn.__name__, traceback.format_exc()))
        threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = Server(os.path.realpath(args.server))
    prober = Prober(server)
    prober.start()
    rss = []
    try:
        authenticated_request(server)
        for r in range(args.rounds):
            results = []
            # Together, then the slow heads with nothing but slow bodies
            # beside them (so the header timeout, not eviction, ends them).
            run_together(server, [idle_flood, slow_loris, slow_bodies, oversized], results)
            run_together(server, [slow_loris, slow_bodies], results)
            assert any(" 16 answered 408" in x for x in results), results
            authenticated_request(server)
            time.sleep(1.5)  # the idle connections of this round time out
            rss.append(server.rss_kib())
            print("round %d: %s; server RSS %d KiB; healthz answered %d times" % (
                r + 1, "; ".join(results), rss[-1], prober.ok), flush=True)
        prober.stop_flag.set()
        prober.join()
        assert not prober.failures, "healthz failed during the attacks: %r" % prober.failures[:5]
        assert prober.ok > 0
        assert rss[-1] <= rss[0] + 24 * 1024, "server memory grew %r KiB over the rounds" % rss
        print("memory after each round (KiB):", rss)
    finally:
        prober.stop_flag.set()
        code = server.stop()
    log = "".join(server.lines)
    assert code == 0, "exit status %r after SIGTERM" % code
    assert KEY not in log, "the key in the server's log"
    assert "trainer_server: HTTP:" in log, log[-2000:]
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
