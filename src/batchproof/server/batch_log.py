"""The per-batch log line the probe reads, on stderr and optionally in a file."""

import logging
import sys
from pathlib import Path

from batchproof.engine.engine import BatchSummary
from batchproof.server.metrics import Metrics


def batch_line(summary: BatchSummary) -> str:
    m = summary.max_batch_size
    per_slot = summary.num_tokens / summary.duration_s / m if summary.duration_s > 0 and m else 0.0
    return f"batch m={m} done in {summary.duration_s * 1000:.0f}ms ({per_slot:.1f} tok/s/slot)"


MAX_NAMED = 32


def drafts_line(summary: BatchSummary) -> str | None:
    """Speculative decoding's counts per request of the batch (those with drafts), or None."""
    if not summary.drafts:
        return None
    proposed = sum(p for _, p, _ in summary.drafts)
    accepted = sum(a for _, _, a in summary.drafts)
    # A busy period may span thousands of requests: the line names the first few.
    each = ", ".join(f"{request_id} {a}/{p}" for request_id, p, a in summary.drafts[:MAX_NAMED])
    more = f", and {len(summary.drafts) - MAX_NAMED} more" if len(summary.drafts) > MAX_NAMED else ""
    return f"speculative: accepted {accepted}/{proposed} drafted tokens ({each}{more})"


class BatchLog:
    def __init__(self, metrics: Metrics, log_file: Path | None) -> None:
        self.metrics = metrics
        self.logger = logging.getLogger(f"batchproof.batch.{id(self)}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        formatter = logging.Formatter("%(asctime)s %(message)s")
        handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
        if log_file is not None:
            handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
        for handler in handlers:
            handler.setFormatter(formatter)
            self.logger.addHandler(handler)

    def __call__(self, summary: BatchSummary) -> None:
        """Called on the engine thread when a batch ends."""
        self.metrics.batch_size.observe(summary.max_batch_size)
        self.logger.info(batch_line(summary))
        for _, proposed, accepted in summary.drafts:
            self.metrics.draft_tokens.inc(proposed)
            self.metrics.accepted_tokens.inc(accepted)
            self.metrics.acceptance.observe(accepted / proposed)
        if (line := drafts_line(summary)) is not None:  # its own line: the probe reads `batch m=` lines as they are
            self.logger.info(line)
        for handler in self.logger.handlers:
            handler.flush()

    def close(self) -> None:
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
