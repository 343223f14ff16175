"""The fleet's own settings: how many replicas, where, and how big each is."""

from dataclasses import dataclass, field

from batchproof.common.config import require


@dataclass(frozen=True)
class FleetConfig:
    """How many replicas, on which Ray cluster, with how many threads each."""

    replicas: int = field(default=2, metadata={"help": "engine replicas (each its own KV cache and batching)"})
    address: str | None = field(
        default=None, metadata={"help": "Ray cluster to join: 'auto' or 'ray://HOST:PORT' (default: start a local "
                                        "Ray instance on this machine)"}
    )
    threads_per_replica: int = field(
        default=1, metadata={"help": "CPU threads (and Ray CPUs) of each replica; on CUDA each takes one GPU"}
    )

    def __post_init__(self) -> None:
        require(self.replicas >= 1, f"replicas must be >= 1, got {self.replicas}")
        require(self.threads_per_replica >= 1, f"threads_per_replica must be >= 1, got {self.threads_per_replica}")
