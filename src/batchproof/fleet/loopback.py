"""A local fleet's Ray listens on loopback only: Ray's own processes, and Serve's replica gRPC server."""

# Left to itself, a local Ray instance takes the machine's network address as its node's and
# listens there and on every interface: the GCS, the raylet, each worker's gRPC server, the
# dashboard agent (whose job API runs any command), the runtime-env agent and the metrics
# exporters. Ray derives every one of those bind addresses from the node's address (loopback
# when the node's address is loopback), except Serve's replica-to-replica gRPC server, which
# binds "[::]:0" itself.

import ipaddress
import os

import ray
import ray._private.ray_constants as ray_constants
import ray.serve._private.replica as serve_replica
from ray._common.network_utils import build_address

LOOPBACK = "127.0.0.1"
# Ray's switch for an instance that is one machine only (its default on macOS and Windows). Off,
# Ray keeps a loopback node address; on (Linux's default), ray.init(_node_ip_address="127.0.0.1")
# is replaced by the machine's reachable address (services.resolve_ip_for_localhost).
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_EVERY_INTERFACE = "[::]"


def keep_ray_on_loopback() -> None:
    """Before ray.init starts a local instance: its node address stays LOOPBACK."""
    os.environ[SINGLE_MACHINE_ENV] = "0"  # the Python processes Ray starts read it when they import ray
    ray_constants.ENABLE_RAY_CLUSTER = False  # this one read it already


def require_loopback_node() -> None:
    """After ray.init: refuse to go on if Ray took another address anyway (a Ray version that
    reads its settings elsewhere), rather than serve with listeners on the network."""
    address = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(address).is_loopback:
        raise RuntimeError(f"the local Ray instance took the node address {address}, not {LOOPBACK}; "
                           "its processes would listen on the network")


def bind_serve_grpc_to_node_address() -> None:
    """In a replica, before Serve starts its replica-to-replica gRPC server: bind it to this node's
    address (the address Serve's routers dial it on) instead of every interface."""
    original = serve_replica.add_port_to_grpc_server
    node_address = ray.util.get_node_ip_address()

    def add_port(server, address: str) -> int:
        host, port = address.rsplit(":", 1)
        if host == _EVERY_INTERFACE:
            address = build_address(node_address, int(port))
        return original(server, address)

    serve_replica.add_port_to_grpc_server = add_port
