"""The witness (version 3, aprender perf041-compatible): identity, reference, bands, verdict."""

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchproof.common.hashing import file_sha256
from batchproof.probe.config import ProbeConfig
from batchproof.probe.matrix import Matrix
from batchproof.probe.verdict import BandJudgement, ReferenceJudgement, Result, band_rate

WITNESS_VERSION = 3
PROBE = "batchproof"
TOP_LOGPROBS = 2


@dataclass(frozen=True)
class Identity:
    """What served, as given on the command line; never guessed."""

    host: str | None
    commit: str | None
    binary_sha256: str | None
    model: dict[str, str] | None


@dataclass(frozen=True)
class SlotRecord:
    completion_tokens: int | None
    finish_reason: str | None
    refused: str | None
    decode_tok_s: float | None


def identify(config: ProbeConfig) -> Identity:
    model = None
    if config.model_file is not None:
        model = {"path": config.model_file.name, "sha256": file_sha256(config.model_file)}
    binary = file_sha256(config.binary) if config.binary is not None else config.binary_sha256
    return Identity(config.host, config.commit, binary, model)


def sampler(matrix: Matrix) -> dict[str, Any]:
    return {
        "temperature": matrix.temperature,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "max_tokens": matrix.n_predict,
        "top_logprobs": TOP_LOGPROBS,
    }


def reference_record(reference: ReferenceJudgement) -> dict[str, Any]:
    record: dict[str, Any] = {
        "stable": reference.is_stable,
        "tokens": reference.tokens,
        "self_divergence_at": reference.self_divergence_at,
    }
    if reference.reason is not None:
        record["reason"] = reference.reason
    return record


def band_record(
    c: int,
    m_formed: int,
    m_formed_source: str | None,
    judgement: BandJudgement,
    slots: list[SlotRecord],
    matrix: Matrix,
) -> dict[str, Any]:
    """One band in the witness's key order; the margin key only when the streams part."""
    record: dict[str, Any] = {
        "c": c,
        "m_formed": m_formed,
        "m_formed_source": m_formed_source,
        "result": judgement.result,
        "divergence_at": judgement.divergence_at,
    }
    if judgement.top2_margin_at_divergence is not None:
        record["top2_margin_at_divergence"] = judgement.top2_margin_at_divergence
    record |= {
        "intra_agree_to": judgement.intra_agree_to,
        "max_constant_run": judgement.max_constant_run,
        "declared_min": matrix.min_agree_tokens,
        "max_constant_run_declared": matrix.max_constant_run,
        "reason": judgement.reason,
        "decode_tok_s": band_rate([s.decode_tok_s for s in slots]),
        "slots": [{"i": i, **asdict(s)} for i, s in enumerate(slots)],
    }
    return record


@dataclass(frozen=True)
class RunRecord:
    """What a run measured, ready for the witness."""

    server_info: dict[str, Any] | None
    served_model: str | None
    reference: ReferenceJudgement
    bands: list[dict[str, Any]]
    result: Result
    unreachable: str | None = None


def build_witness(
    config: ProbeConfig,
    matrix: Matrix,
    identity: Identity,
    outcome: RunRecord,
) -> dict[str, Any]:
    return {
        "witness_version": WITNESS_VERSION,
        "probe": PROBE,
        "host": identity.host,
        "commit": identity.commit,
        "binary_sha256": identity.binary_sha256,
        "model": identity.model,
        "prompt_sha256": hashlib.sha256(config.prompt.encode("utf-8")).hexdigest(),
        "sampler": sampler(matrix),
        "declared_min": matrix.min_agree_tokens,
        "served_model": outcome.served_model,
        "server": outcome.server_info,
        "reference": reference_record(outcome.reference),
        "bands": outcome.bands,
        "result": outcome.result,
    }


def write_witness(path: Path, witness: dict[str, Any]) -> None:
    path.write_text(json.dumps(witness, indent=2, allow_nan=False) + "\n", encoding="utf-8")
