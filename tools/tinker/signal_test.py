#!/usr/bin/env python3
"""SIGTERM, SIGINT and SIGHUP stop //tools:trainer_server gracefully.

    signal_test.py SERVER_BINARY LAUNCH_BINARY

Standard library only. For each signal, a server (simulated world of 2, and
2 gloo processes under tools/launch) is started on a free port; once
healthz answers, a model is created and a save_weights request is queued
(its POST returns only once the request is in the queue), then the signal
goes to the server (or to the launcher, which forwards it). The test
asserts exit status 0, the logged stop ("got signal N", "stopped"), and
that the queued checkpoint was written whole: a graceful stop runs every
queued request before it stops (trainer_server.cc, Note [Stopping on a
signal]). Before issue 15's fix the process died of the signal (status
-15, -2, -1 here; 143, 130, 129 in a shell).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


class Server:
    def __init__(self, server, launch):
        self.state_dir = tempfile.mkdtemp(prefix="zerostep-signal-test-")
        cmd = [server, "--port=0", "--state-dir=" + self.state_dir, "--stage=2"]
        if launch:
            cmd = [launch, "--nproc=2", "--", *cmd, "--backend=gloo"]
        else:
            cmd += ["--world=2"]
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines = []
        self.url = None
        for line in self.proc.stdout:  # ends if the server dies
            self.log(line)
            if "listening on http" in line:
                self.url = line.split()[-1]
                break
        assert self.url, "the server did not start: %s" % " ".join(cmd)
        self.drain = threading.Thread(target=self._drain)
        self.drain.start()

    def log(self, line):
        self.lines.append(line)
        sys.stdout.write("  server: " + line)

    def _drain(self):
        for line in self.proc.stdout:
            self.log(line)

    def request(self, method, endpoint, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + "/api/v1/" + endpoint, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200, resp.status
            return json.loads(resp.read())

    def result(self, request_id):
        while True:  # long polls; the server answers try_again at most every 30 s
            body = self.request("POST", "retrieve_future", {"request_id": request_id})
            if body.get("type") != "try_again":
                return body

    def wait(self):
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 120 s")
        self.drain.join()
        return code


def check(server_binary, launch, sig):
    s = Server(server_binary, launch)
    try:
        assert s.request("GET", "healthz") == {"status": "ok"}
        session = s.request("POST", "create_session", {})["session_id"]
        created = s.request("POST", "create_model", {
            "session_id": session, "model_seq_id": 0,
            "base_model": "zerostep/tiny-gpt", "lora_config": {"rank": 2, "seed": 3}})
        assert "model_id" in s.result(created["request_id"])
        model_id = created["model_id"]
        # Queued when the POST returns; the signal comes before it can have
        # been retrieved.
        s.request("POST", "save_weights",
                  {"model_id": model_id, "seq_id": 1, "path": "at-signal"})
        s.proc.send_signal(sig)  # the server, or the launcher that forwards it
        code = s.wait()
        log = "".join(s.lines)
        assert code == 0, "exit status %d after %s" % (code, sig.name)
        assert "got signal %d" % sig in log, log
        assert "trainer_server: stopped" in log, log
        if launch:
            assert "rank 1 stopped" in log, log
            assert "every rank exited 0" in log, log
        metas = [os.path.join(d, "tinker_meta.json")
                 for d, _, files in os.walk(s.state_dir)
                 if os.path.basename(d) == "at-signal" and "tinker_meta.json" in files]
        assert len(metas) == 1, ("the queued checkpoint was not written", s.state_dir)
        with open(metas[0]) as f:
            json.load(f)  # whole, not torn
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        shutil.rmtree(s.state_dir, ignore_errors=True)


def main():
    server_binary, launch = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    passed = failed = 0
    for launcher in [None, launch]:
        for sig in SIGNALS:
            name = "%s %s" % ("launch-gloo-2" if launcher else "sim-world2", sig.name)
            print("=== " + name, flush=True)
            try:
                check(server_binary, launcher, sig)
                passed += 1
                print("--- ok " + name, flush=True)
            except Exception:
                failed += 1
                import traceback
                traceback.print_exc()
                print("--- FAILED " + name, flush=True)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
