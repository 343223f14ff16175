"""A free loopback port, for the commands that start a server of their own (bench, witness)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
