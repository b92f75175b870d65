"""Starts and stops a //tools:trainer_server process on a free loopback port.

Shared by the SDK-driven tests (tools/tinker/e2e_test.py, load_test.py) and
examples/tinker_rl/rl_loop.py. Standard library only.

    server = ServerProcess("bazel-bin/tools/trainer_server", "--world=1")
    ... tinker.ServiceClient(base_url=server.url, api_key=API_KEY) ...
    assert server.stop() == 0   # SIGTERM: a graceful stop exits 0
"""

import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# The SDK insists on the prefix; a server started without --api-keys takes
# any key (every request is tenant "default").
API_KEY = "tml-zerostep-local"


class ServerProcess:
    """A trainer_server process on a free port; `url` is its base URL.

    The server's output is echoed with a "server: " prefix (quiet=True
    drops it once the server is listening). Without `state_dir`, a temporary
    state directory is made and removed at stop(). With merge_stderr, the
    server's log (stderr) comes too, and every line is kept in `lines`."""

    def __init__(self, binary, *args, launch=None, state_dir=None, quiet=False,
                 merge_stderr=False):
        self.keep_state = state_dir is not None  # the caller's, kept at stop
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="zerostep-tinker-")
        self.quiet = quiet
        cmd = [binary, "--port=0", "--state-dir=" + self.state_dir, *args]
        if launch:  # real processes: tools/launch prefixes lines with "[rank R] "
            cmd = [launch[0], "--nproc=%d" % launch[1], "--", *cmd]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True,
            stderr=subprocess.STDOUT if merge_stderr else None)
        self.url = None
        self.drain = None
        self.lines = []
        deadline = time.time() + 120
        for line in self.proc.stdout:
            self.lines.append(line)
            sys.stdout.write("server: " + line)
            if "listening on http" in line and "[rank 1" not in line:
                self.url = line.split()[-1]
                break
            if time.time() > deadline:
                break
        if self.url is None:
            self.stop()
            raise AssertionError("trainer_server did not start: " + " ".join(cmd))
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self.quiet:
                sys.stdout.write("server: " + line)

    def stop(self):
        """SIGTERM; returns the exit status (0: a graceful stop), or None
        if the server had to be killed after 30 s."""
        code = self.proc.poll()
        if code is None:
            self.proc.terminate()
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = None
        if self.drain is not None:
            self.drain.join(30)  # every line of the log, read
        if not self.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return code


def run_scenarios(scenarios, only=""):
    """Runs each (name, fn) of `scenarios` (only the one named `only`, if
    given), each fn() raising on failure; prints "=== name" and "--- ok" or
    "--- FAILED", then every failure again, last, where a truncated log (CI
    keeps its tail) still shows them. Returns the exit status: 0 when every
    scenario run passed and at least one ran."""
    passed = failed = 0
    failures = []
    for name, fn in scenarios:
        if only and only != name:
            continue
        print("=== " + name, flush=True)
        try:
            fn()
            passed += 1
            print("--- ok " + name, flush=True)
        except Exception:
            failed += 1
            failures.append((name, traceback.format_exc()))
            traceback.print_exc()
            print("--- FAILED " + name, flush=True)
    for name, trace in failures:
        print("FAILED %s:\n%s" % (name, trace), flush=True)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 and passed > 0 else 1
