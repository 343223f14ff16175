"""The witness (version 3, aprender perf041-compatible): identity, reference, bands, verdict."""

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchproof.common.band import Band, band_json
from batchproof.common.hashing import file_sha256
from batchproof.probe.config import ProbeConfig
from batchproof.probe.judge.logprob_parity import UNMEASURED, LogprobParity, combine, compare
from batchproof.probe.judge.references import as_reference, reference_record, sample
from batchproof.probe.judge.verdict import (
    BandJudgement,
    ReferenceJudgement,
    Result,
    band_rate,
    refusal,
    slot_divergence,
)
from batchproof.probe.matrix import Matrix
from batchproof.probe.records.reply import StreamResult
from batchproof.probe.wire.request import TOP_LOGPROBS

WITNESS_VERSION = 3
PROBE = "batchproof"


@dataclass(frozen=True)
class Identity:
    """What served, as given on the command line; never guessed."""

    host: str | None
    commit: str | None
    binary_sha256: str | None
    model: dict[str, str] | None


@dataclass(frozen=True)
class SlotRecord:
    """One request of a band. The keys after decode_tok_s are additions to v3."""

    completion_tokens: int | None
    finish_reason: str | None
    refused: str | None
    decode_tok_s: float | None
    prompt: int = 0  # index into the witness's `prompts`
    stream_mode: str = "buffered"  # declared | observed | buffered
    stream_mode_conflict: str | None = None  # a declaration the arrivals contradict
    divergence_at: int | None = None  # against its own prompt's m=1 reference
    top2_margin_at_divergence: float | None = None
    logprob_max_abs_diff: float | None = None  # over the agreeing prefix
    logprobs_bitwise_equal: bool | None = None
    logprob_first_diff_at: int | None = None
    replica: str | None = None  # the x-batchproof-replica that served it (None: the server named none)
    reference_replica: str | None = None  # the replica of the m=1 reply it was compared with

    @property
    def parity(self) -> LogprobParity:
        return LogprobParity(self.logprob_max_abs_diff, self.logprobs_bitwise_equal, self.logprob_first_diff_at)


def slot_record(prompt: int, result: StreamResult, reference: StreamResult, n_predict: int) -> SlotRecord:
    """A slot against its own prompt's reference: where it parts, and its logprobs until then."""
    refused = refusal(sample(result), n_predict)
    stream_mode, conflict = result.mode
    divergence, margin, parity = None, None, UNMEASURED
    if refused is None:
        ref = as_reference(reference)
        divergence, margin = slot_divergence(ref.identities, ref.margins, sample(result).identities)
        parity = compare(reference.logprob_vectors(), result.logprob_vectors(), divergence)
    return SlotRecord(
        completion_tokens=result.completion_tokens,
        finish_reason=result.finish_reason,
        refused=refused,
        decode_tok_s=result.decode_tok_s,
        prompt=prompt,
        stream_mode=stream_mode,
        stream_mode_conflict=conflict,
        divergence_at=divergence,
        top2_margin_at_divergence=margin,
        logprob_max_abs_diff=parity.max_abs_diff,
        logprobs_bitwise_equal=parity.is_bitwise_equal,
        logprob_first_diff_at=parity.first_diff_at,
        replica=result.replica,
        reference_replica=reference.replica,
    )


def identify(config: ProbeConfig) -> Identity:
    model = None
    if config.model_file is not None:
        model = {"path": config.model_file.name, "sha256": file_sha256(config.model_file)}
    binary = file_sha256(config.binary) if config.binary is not None else config.binary_sha256
    return Identity(config.host, config.commit, binary, model)


def sampler(matrix: Matrix) -> dict[str, Any]:
    # What the matrix asked; `dropped_fields` says what a server refused and was not sent.
    return {
        "temperature": matrix.temperature,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "max_tokens": matrix.n_predict,
        "top_logprobs": TOP_LOGPROBS,
    }


def band_record(
    c: int,
    m_formed: int,
    m_formed_source: str | None,
    judgement: BandJudgement,
    slots: list[SlotRecord],
    matrix: Matrix,
    divergence_slot: int | None = 0,
    m_formed_by_replica: dict[str, int | None] | None = None,
    logprobs_attributable: bool | None = None,
    probe_cpu_share: float | None = None,
) -> Band:
    """One band; `logprobs_attributable` is False when the m=1 reference's own runs differ in
    logprobs (a difference here is then not batching's), None when they were not compared."""
    parity = combine([s.parity for s in slots])
    return Band(
        c=c,
        m_formed=m_formed,
        m_formed_source=m_formed_source,
        result=judgement.result,
        divergence_at=judgement.divergence_at,
        top2_margin_at_divergence=judgement.top2_margin_at_divergence,
        intra_agree_to=judgement.intra_agree_to,
        max_constant_run=judgement.max_constant_run,
        declared_min=matrix.min_agree_tokens,
        max_constant_run_declared=matrix.max_constant_run,
        reason=judgement.reason,
        decode_tok_s=band_rate([s.decode_tok_s for s in slots]),
        divergence_slot=divergence_slot if judgement.divergence_at is not None else None,
        logprob_max_abs_diff=parity.max_abs_diff,
        logprobs_bitwise_equal=parity.is_bitwise_equal,
        logprobs_attributable=logprobs_attributable,
        m_formed_by_replica=m_formed_by_replica or None,  # null when the histogram names no replica
        probe_cpu_share=probe_cpu_share,
        slots=[{"i": i, **asdict(s)} for i, s in enumerate(slots)],
    )


@dataclass(frozen=True)
class RunRecord:
    """What a run measured, ready for the witness."""

    server_info: dict[str, Any] | None
    served_model: str | None
    reference: ReferenceJudgement
    bands: list[Band]
    result: Result
    unreachable: str | None = None
    references: list[dict[str, Any]] | None = None  # one per prompt, an addition to v3
    fleet: dict[str, Any] | None = None  # the cross-replica agreement, in fleet mode (an addition)
    reference_logprobs: dict[str, Any] | None = None  # the m=1 runs' logprob stability
    cache: dict[str, Any] | None = None  # --cache: cold against warm
    stream_parity: dict[str, Any] | None = None  # --stream-parity: streamed against whole
    fail_open: list[dict[str, Any]] | None = None  # 200s without the logprobs asked for
    dropped_fields: list[str] | None = None  # fields the server refused, left out of every request


def prompt_set_sha256(prompts: tuple[str, ...]) -> str:
    """One prompt's sha256 of its UTF-8 bytes (as v3 defines it); a set's, of its JSON list."""
    data = prompts[0] if len(prompts) == 1 else json.dumps(list(prompts), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def build_witness(
    config: ProbeConfig,
    matrix: Matrix,
    identity: Identity,
    outcome: RunRecord,
    prompts: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    prompts = prompts or (config.prompt,)
    return {
        "witness_version": WITNESS_VERSION,
        "probe": PROBE,
        "host": identity.host,
        "commit": identity.commit,
        "binary_sha256": identity.binary_sha256,
        "model": identity.model,
        "prompt_sha256": prompt_set_sha256(prompts),
        "sampler": sampler(matrix),
        "declared_min": matrix.min_agree_tokens,
        "served_model": outcome.served_model,
        "server": outcome.server_info,
        "reference": reference_record(outcome.reference),
        "bands": [band_json(band) for band in outcome.bands],
        "result": outcome.result,
        # Additions to v3: how the bands were fired, each prompt's own m=1 reference, and on a
        # fleet (--fleet) which replicas served and whether they agree.
        "mode": config.mode.prompts.name,
        "route": config.route,
        "stagger_ms": config.stagger_ms,
        "prompts": [{"i": i, "sha256": prompt_set_sha256((p,)), "chars": len(p)} for i, p in enumerate(prompts)],
        "references": outcome.references or [],
        "fleet": outcome.fleet,
        # Additions for any server (issue 27): the m=1 runs compared on logprobs (v3's `reference`
        # keeps its keys: it judges tokens), the fields the probe had to leave out (and so what
        # it could not ask), the server-specific fields it added, the 200s that came back without
        # the logprobs asked for, and the --cache and --stream-parity sections (null when not run).
        "reference_logprobs": outcome.reference_logprobs,
        "dropped_fields": outcome.dropped_fields or [],
        "extra_body": config.extra_body,
        "fail_open": outcome.fail_open or [],
        "cache": outcome.cache,
        "stream_parity": outcome.stream_parity,
    }


def write_witness(path: Path, witness: dict[str, Any]) -> None:
    path.write_text(json.dumps(witness, indent=2, allow_nan=False) + "\n", encoding="utf-8")
