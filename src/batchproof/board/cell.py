"""One cell of the board: a server in one configuration, probed twice, each witness checked and
drawn; the cell's verdict only when the two runs agree."""

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchproof.board.spec import CONFIGURATIONS
from batchproof.check.contract import BlessedModel, Contract
from batchproof.check.rules import judge
from batchproof.check.witness import WitnessError, parse_witness
from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import ProgressDisplay
from batchproof.probe.matrix import Matrix
from batchproof.probe.run import Prober, fired_prompts
from batchproof.probe.witness import build_witness, identify, write_witness
from batchproof.report.page import render

RUNS = 2
ADMISSIBLE, NOT_ADMISSIBLE = "ADMISSIBLE", "NOT ADMISSIBLE"
UNSTABLE, UNREACHABLE, NOT_RUN = "UNSTABLE", "UNREACHABLE", "NOT RUN"
# A control is caught only for batching's sake: a reason from the bands (S5, S6) or their logprobs,
# not a missing identity or an unreachable server, which would fail a well-behaved server too.
BATCHING_REASONS = ("S5:", "S6:", "logprobs:")


@dataclass(frozen=True)
class Target:
    """A server ready to be probed, and what the witness says served."""

    url: str
    model: Path | None = None
    server_log: Path | None = None
    probe: dict[str, Any] = dataclasses.field(default_factory=dict)
    host: str | None = None
    commit: str | None = None
    binary: Path | None = None
    binary_sha256: str | None = None


def probe_config(target: Target, configuration: str, matrix: Path | None, witness: Path) -> ProbeConfig:
    """The probe's settings for one run (the board file's were checked when it was read)."""
    return ProbeConfig(url=target.url, witness=witness, matrix=matrix, model_file=target.model,
                       server_log=target.server_log, host=target.host, commit=target.commit, binary=target.binary,
                       binary_sha256=None if target.binary is not None else target.binary_sha256,
                       **CONFIGURATIONS[configuration], **target.probe)


def probe(config: ProbeConfig, matrix: Matrix) -> tuple[dict[str, Any], str | None]:
    """One probe run as `batchproof probe` makes it: (the witness, why the server was unreachable)."""
    prompts = fired_prompts(config, matrix, config.prompt_set())
    with ProgressDisplay(is_live=False) as progress:
        record = asyncio.run(Prober(config, matrix, progress, prompts).run())
    witness = build_witness(config, matrix, identify(config), record, prompts)
    assert config.witness is not None
    write_witness(config.witness, witness)
    return witness, record.unreachable


def served_contract(contract: Contract, witness: dict[str, Any]) -> Contract:
    """The board's contract for this witness: the board judges batching, not which model a server
    serves, so the model it names (by its sha256) is the blessed one."""
    model = witness.get("model")
    if not model:
        return contract
    return dataclasses.replace(contract, blessed_models=(BlessedModel(model["path"], model["sha256"]),))


def s7(witness: dict[str, Any], ratio: float) -> dict[str, Any] | None:
    """c=4's per-request decode rate as a share of c=1's, and whether it keeps the contract's share."""
    rates = {band["c"]: band.get("decode_tok_s") for band in witness.get("bands") or []}
    one, four = rates.get(1), rates.get(4)
    if not one or not four:
        return None
    return {"c1_tok_s": one, "c4_tok_s": four, "share": four / one, "is_kept": four >= ratio * one}


def section(witness: dict[str, Any], key: str) -> dict[str, Any] | None:
    found = witness.get(key)
    if not isinstance(found, dict):
        return None
    return {"result": found.get("result"), "num_findings": len(found.get("findings") or []),
            "reason": found.get("reason")}


def summary(witness: dict[str, Any], reasons: list[str], unreachable: str | None, ratio: float,
            files: dict[str, str]) -> dict[str, Any]:
    """What the board shows of one run."""
    verdict = UNREACHABLE if unreachable is not None else (NOT_ADMISSIBLE if reasons else ADMISSIBLE)
    bands = [{key: band.get(key) for key in ("c", "result", "m_formed", "logprob_max_abs_diff",
                                              "logprobs_bitwise_equal")} for band in witness.get("bands") or []]
    return {"verdict": verdict, "probe_result": witness.get("result"), "unreachable": unreachable,
            "reasons": reasons, "bands": bands, "s7": s7(witness, ratio), "cache": section(witness, "cache"),
            "stream_parity": section(witness, "stream_parity"),
            "fail_open": [f"{f['route']} ({'streamed' if f['streamed'] else 'whole'}): {f['requests']} "
                          f"request(s) with {f.get('what') or 'no logprobs'}" for f in witness.get("fail_open") or []],
            **files}


def kept_witness(path: Path) -> dict[str, Any] | None:
    """An earlier board's witness at `path` that measured a band (a resumed board checks it again
    instead of probing); None where there is none, it does not parse, or the probe fired no band (the
    server was unreachable: it may be up now). A band that could not be measured was measured so."""
    try:
        witness = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(witness, dict) or not witness.get("bands"):
        return None
    return witness


def run_once(target: Target | None, configuration: str, matrix_path: Path | None, matrix: Matrix,
             contract: Contract, out: Path, stem: str, resume: bool = False) -> dict[str, Any]:
    """One probe run, checked and drawn; with `resume`, the witness already there when there is one
    (then `target` may be None: the server need not be up)."""
    witness_path, report_path = out / f"{stem}.json", out / f"{stem}.html"
    kept = kept_witness(witness_path) if resume else None
    if kept is not None:
        witness, unreachable = kept, None
    else:
        assert target is not None, "a run without a witness to keep is probed"
        witness, unreachable = probe(probe_config(target, configuration, matrix_path, witness_path), matrix)
    judged = served_contract(contract, witness)
    if unreachable is not None:  # nothing measured, nothing to judge or draw
        return summary(witness, [], unreachable, judged.decode_ratio_c4_over_c1,
                       {"witness": witness_path.name, "report": None})
    try:
        reasons = judge(parse_witness(json.dumps(witness)), judged)
    except WitnessError as error:
        # Nothing to judge: the probe fired no band, since the server was not deterministic alone
        # (its two m=1 runs differ); that is the verdict's reason, not a reason to stop the board.
        why = (witness.get("reference") or {}).get("reason") or str(error)
        reasons = [f"reference: the m=1 reference is not stable: {why}"]
    verdict = NOT_ADMISSIBLE if reasons else ADMISSIBLE
    report_path.write_text(render(witness, verdict, reasons, judged.decode_ratio_c4_over_c1, witness_path.name),
                           encoding="utf-8")
    return summary(witness, reasons, None, judged.decode_ratio_c4_over_c1,
                   {"witness": witness_path.name, "report": report_path.name})


def cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' verdict when they agree (probe result and check verdict both); else UNSTABLE."""
    if any(run["verdict"] == UNREACHABLE for run in runs):
        return {"verdict": UNREACHABLE, "agree": None, "why": runs[-1]["unreachable"], "runs": runs}
    agree = len({(run["verdict"], run["probe_result"]) for run in runs}) == 1
    return {"verdict": runs[0]["verdict"] if agree else UNSTABLE, "agree": agree, "why": None, "runs": runs}


def is_caught(row: dict[str, Any]) -> bool:
    """A control's cell failed as a batch-variant server must: both runs NOT ADMISSIBLE for batching.
    Their probe results may differ (the cell is then UNSTABLE): a control must fail, and each run
    alone fails it for batching's sake; how its bands came out need not repeat (the drift server's
    c=16 band is sometimes formed whole, sometimes not, on two busy cores)."""
    runs = row["runs"]
    return row["verdict"] in (NOT_ADMISSIBLE, UNSTABLE) and len(runs) == RUNS and all(
        run["verdict"] == NOT_ADMISSIBLE and any(reason.startswith(BATCHING_REASONS) for reason in run["reasons"])
        for run in runs)
