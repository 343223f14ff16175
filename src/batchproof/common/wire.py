"""What the server writes and the probe reads on the wire: logprob spelling and SSE framing."""

import json
import math
from dataclasses import dataclass, field
from typing import Any

ABSENT_LOGPROB = -9999.0  # OpenAI's spelling of log(0); JSON has no infinities
DONE = "[DONE]"  # the payload that ends an OpenAI stream
SSE_DONE = f"data: {DONE}\n\n".encode()
# On every generation reply of a batchproof server: the id of the replica that computed it
# (a fleet's replicas, or a single server's one id), so a client can tell who served.
REPLICA_HEADER = "x-batchproof-replica"


def dumps(obj: Any) -> str:
    # allow_nan=False: a NaN or infinity reaching the wire is a bug, and it must fail loudly.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def wire_logprob(value: float) -> float:
    """-inf is sent as ABSENT_LOGPROB."""
    return ABSENT_LOGPROB if value == -math.inf else value


def sse(obj: Any) -> bytes:
    """One server-sent event carrying obj as JSON."""
    return f"data: {dumps(obj)}\n\n".encode()


@dataclass
class SSEReader:
    """Server-sent events from a body read line by line: feed() each line, and it returns
    (event name, payload) when a blank line completes an event; finish() returns a last
    event the body ended without a blank line after. Comments and other fields are skipped."""

    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, line: str) -> tuple[str, str] | None:
        if line == "":
            return self.finish()
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            self._event = line[6:].strip()
        return None

    def finish(self) -> tuple[str, str] | None:
        done = (self._event, "\n".join(self._data)) if self._data else None
        self._data, self._event = [], ""
        return done
