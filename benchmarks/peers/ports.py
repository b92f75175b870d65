"""A rendezvous port for ranks started by a Python driver.

A port picked by binding port 0 lies in the kernel's ephemeral range, where
any other process's outgoing or port-0 socket (Gloo's pairs, a concurrent
test's server) may take it between the pick and rank 0's bind, which for
spawned Python ranks is seconds later (importing torch). So the port is
picked at random below that range and checked free, as tools/launch picks
(tools/launcher.cc, pick_master_port); port 0's pick is the fallback where
the range leaves no room below it. Standard library only: the drivers run
under any python3.
"""
import random
import socket


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def can_bind(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def master_port():
    low = ephemeral_low()
    if low - 10000 >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(10000, low)
            if can_bind(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
