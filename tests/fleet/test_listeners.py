"""The listener census the fleet's loopback test relies on: it finds a process tree's listening
sockets, and tells a loopback one from one open to every interface, on any machine (no fleet)."""

import ipaddress
import os
import subprocess
import sys
import time

import pytest

from tests.helpers.fleet import Listener, listeners

# A child that listens on loopback and on every interface (IPv4 and dual-stack IPv6), then waits.
CHILD = """
import socket, sys, time
held = []
for family, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::1"),
                     (socket.AF_INET6, "::")]:
    s = socket.socket(family)
    s.bind((host, 0))
    s.listen()
    held.append(s)
    print(host, s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc (Linux)")
def test_a_childs_listeners_are_found_and_told_apart() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        ports = dict(child.stdout.readline().split() for _ in range(4))
        deadline = time.monotonic() + 10
        while len(found := listeners(child.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = {(str(listener.address), str(listener.port)): listener.is_loopback for listener in found}
        assert seen == {("127.0.0.1", ports["127.0.0.1"]): True, ("0.0.0.0", ports["0.0.0.0"]): False,
                        ("::1", ports["::1"]): True, ("::", ports["::"]): False}
        assert all(listener.pid == child.pid for listener in found)
    finally:
        child.kill()
        child.wait()


def test_an_ipv4_mapped_loopback_counts_as_loopback() -> None:
    # gRPC's dual-stack socket bound to 127.0.0.1 shows in /proc/net/tcp6 as ::ffff:127.0.0.1.
    assert Listener(ipaddress.ip_address("::ffff:127.0.0.1"), 1, 1, "").is_loopback
    assert not Listener(ipaddress.ip_address("::ffff:192.0.2.2"), 1, 1, "").is_loopback
