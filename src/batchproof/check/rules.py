"""The shape check's rules: a pure function from a typed witness and a contract to reasons."""

import json
import string
from collections import Counter

from batchproof.check.contract import BlessedModel, Contract
from batchproof.check.witness import IDENTITY_KEYS
from batchproof.common.band import Band

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _ascii_lower(text: str) -> str:
    # str.lower() folds non-ASCII letters too; the contract's prefixes are ASCII-blind only.
    return text.translate(_ASCII_LOWER)


def _blank(value: str | None) -> bool:
    return value is None or not value.strip()


def _near_tie(margin: float, contract: Contract) -> bool:
    return 0 <= margin < contract.near_tie_eps


def _copies(bands: list[Band], c: int) -> list[Band]:
    return [band for band in bands if band.c == c]


def _sha_matches(model: BlessedModel, sha256: str) -> bool:
    return model.sha256 is None or model.sha256.lower() == sha256.strip().lower()


def model_reasons(model: dict | None, contract: Contract) -> list[str]:
    """S1: a blessed model, named by its sha256 (the contract's, when it gives one)."""
    path = (model or {}).get("path") or ""
    sha256 = (model or {}).get("sha256")
    matches = [m for m in contract.blessed_models if _ascii_lower(path).startswith(_ascii_lower(m.prefix))]
    reasons = []
    if not matches:
        prefixes = ", ".join(m.prefix for m in contract.blessed_models)
        reasons.append(f"S1: model {json.dumps(path)} does not start with a blessed prefix ({prefixes})")
    if _blank(sha256):
        reasons.append("S1: model sha256 missing")
    elif matches and not any(_sha_matches(m, sha256) for m in matches):
        wanted = " or ".join(str(m.sha256) for m in matches)
        reasons.append(f"S1: model sha256 {sha256} is not the blessed {wanted}")
    return reasons


def identity_reasons(witness: dict) -> list[str]:
    """S4: a witness says what was measured, where, from which build and prompt."""
    return [f"S4: identity field {key} missing" for key in IDENTITY_KEYS if _blank(witness.get(key))]


def _judged_slots(band: Band) -> list[dict]:
    """The slots that carry their own divergence_at: each is judged against its own reference."""
    return [slot for slot in band.slots if slot["divergence_at"] is not None]


def divergence_reason(name: str, declared_min: int, at: int, margin: float | None, contract: Contract) -> str | None:
    """S5 for one divergence index: at least declared_min, or a recorded near-tie."""
    if at >= declared_min:
        return None
    if margin is None:
        return f"S5: {name} diverges from m=1 at {at} < declared_min {declared_min} with no top-2 margin recorded"
    if _near_tie(margin, contract):
        return None
    return (
        f"S5: {name} diverges from m=1 at {at} < declared_min {declared_min}; its top-2 margin "
        f"{margin!r} is not a near-tie (needs 0 <= margin < {contract.near_tie_eps!r})"
    )


def agreement_reasons(band: Band, contract: Contract) -> list[str]:
    """S5: agreement with m=1 to the band's own declared_min, or a recorded near-tie; per slot
    when the slots record their own divergence (mixed bands: one reference per prompt)."""
    c, declared_min, at = band.c, band.declared_min, band.divergence_at
    if declared_min is None:
        return [f"S5: c={c} declared_min not recorded, so agreement with m=1 cannot be checked"]
    slots = _judged_slots(band)
    if slots:
        found = (
            divergence_reason(f"c={c} slot {s['i']}", declared_min, s["divergence_at"],
                              s["top2_margin_at_divergence"], contract)
            for s in slots
        )
        return [reason for reason in found if reason is not None]
    if at is None:
        # A band that did not PASS already has its S6 reason; only a PASS must carry the index.
        if band.result == "PASS":
            return [f"S5: c={c} divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured"]
        return []
    reason = divergence_reason(f"c={c}", declared_min, at, band.top2_margin_at_divergence, contract)
    return [] if reason is None else [reason]


def logprob_reason(band: Band, contract: Contract) -> str | None:
    """Bitwise logprobs (an optional clause): tokens flip only at near-ties, logprobs show
    a batch-variant path on every request. When the m=1 reference's own runs already differ,
    the difference is not batching's: under a contract that requires a stable reference the
    reference's reason says so (once, naming it, not every band); otherwise it is labelled."""
    if not contract.require_bitwise_logprobs or band.logprobs_bitwise_equal is True:
        return None
    is_unattributable = band.logprobs_attributable is False
    if is_unattributable and contract.require_stable_reference:
        return None
    c, need = band.c, "the contract requires logprobs bitwise equal to m=1's"
    if is_unattributable:
        need = f"not attributable to batching (the m=1 reference's own runs differ); {need}"
    if band.logprobs_bitwise_equal is None:
        return f"logprobs: c={c} logprob parity with m=1 not recorded; {need}"
    diff = band.logprob_max_abs_diff
    size = "by an unrecorded amount" if diff is None else f"by up to {diff:.3g}"
    measured = [s for s in band.slots if s["logprob_max_abs_diff"] is not None]
    worst = max(measured, key=lambda s: s["logprob_max_abs_diff"], default=None)
    where = ""
    if worst is not None and worst["logprobs_bitwise_equal"] is False:
        first = worst["logprob_first_diff_at"]
        where = f" (slot {worst['i']}" + ("" if first is None else f", first at token {first}") + ")"
    return f"logprobs: c={c} logprobs differ from m=1 {size}{where}; {need}"


def _or_unknown(m: int | None) -> str:
    return "unknown" if m is None else str(m)


def fleet_shape_reason(band: Band) -> str | None:
    """S3 on a fleet, where a band of c is split over the replicas: each replica must have
    batched all the band's slots it served together (m = its share), as a single server must
    batch all c. The band's m_formed, the largest batch one replica formed, is then about c/N."""
    served = Counter(slot["replica"] for slot in band.slots)
    formed = band.m_formed_by_replica
    wrong = [
        f"replica {replica} formed m={_or_unknown(formed.get(replica, 0))} for its {served[replica]} slots"
        for replica in dict.fromkeys([*served, *formed])
        if formed.get(replica, 0) != served[replica]
    ]
    return None if not wrong else f"S3: c={band.c} on the fleet: {', '.join(wrong)} (the shape was not served)"


def shape_reason(band: Band, is_fleet: bool) -> str | None:
    """S3: the band's shape was served (on a fleet whose slots name their replicas, per replica)."""
    c, m_formed = band.c, band.m_formed
    replicas = [slot["replica"] for slot in band.slots]
    if is_fleet and band.m_formed_by_replica is not None and replicas and None not in replicas:
        return fleet_shape_reason(band)
    if m_formed is None:
        return f"S3: c={c} m_formed not recorded (the shape is not shown)"
    if m_formed != c:
        return f"S3: c={c} m_formed {m_formed} != c (the shape was not served)"
    return None


def copy_reasons(band: Band, contract: Contract, is_fleet: bool = False) -> list[str]:
    """S6, S3, the floor and S5 for one recorded copy of a band."""
    c, result, declared_min = band.c, band.result, band.declared_min
    reasons = []
    if result is None:
        reasons.append(f"S6: c={c} result not recorded")
    elif result != "PASS":
        reasons.append(f"S6: c={c} result {result} is not PASS")
    shape = shape_reason(band, is_fleet)
    if shape is not None:
        reasons.append(shape)
    if declared_min is not None and declared_min < contract.declared_min_floor:
        reasons.append(
            f"floor: c={c} declared_min {declared_min} is below the contract's floor "
            f"{contract.declared_min_floor}"
        )
    reasons.extend(agreement_reasons(band, contract))
    logprobs = logprob_reason(band, contract)
    return reasons if logprobs is None else [*reasons, logprobs]


def band_reasons(bands: list[Band], contract: Contract, is_fleet: bool = False) -> list[str]:
    """Every contract band, once, each copy checked: a FAIL copy is never masked by a PASS."""
    reasons = []
    for c in contract.bands:
        copies = _copies(bands, c)
        if not copies:
            reasons.append(f"band c={c} not measured")
        if len(copies) > 1:
            reasons.append(f"band c={c} recorded {len(copies)} times; a witness has one band per c")
        for band in copies:
            reasons.extend(copy_reasons(band, contract, is_fleet))
    return reasons


def _leans(declared_min: int | None, at: int | None, margin: float | None, contract: Contract) -> bool:
    if declared_min is None or at is None or margin is None:
        return False
    return at < declared_min and _near_tie(margin, contract)


def leans_on_near_tie(band: Band, contract: Contract) -> bool:
    """True when S5 admits `band` (or one of its judged slots) only through the near-tie clause."""
    slots = _judged_slots(band)
    if slots:
        return any(
            _leans(band.declared_min, s["divergence_at"], s["top2_margin_at_divergence"], contract) for s in slots
        )
    return _leans(band.declared_min, band.divergence_at, band.top2_margin_at_divergence, contract)


def near_tie_cap_reasons(bands: list[Band], contract: Contract) -> list[str]:
    """The cap: c>1 bands share one batched path, so many near-ties point at the path."""
    leaning = [
        band
        for c in contract.bands
        if c > 1
        for band in _copies(bands, c)
        if leans_on_near_tie(band, contract)
    ]
    if len(leaning) <= contract.near_tie_cap:
        return []
    names = ", ".join(f"c={band.c}" for band in leaning)
    return [
        f"near-tie cap: {len(leaning)} batched bands ({names}) are admitted only by a near-tie "
        f"margin; the contract allows {contract.near_tie_cap}"
    ]


def _rate(band: Band) -> float | None:
    rate = band.decode_tok_s
    return rate if rate is not None and rate > 0 else None


def decode_reasons(bands: list[Band], contract: Contract) -> list[str]:
    """S7: per-request decode at c=4 keeps at least the contract's share of c=1's."""
    ones, fours = _copies(bands, 1), _copies(bands, 4)
    # A missing or doubled band already has its reason, and which copy to read is undefined.
    if len(ones) != 1 or len(fours) != 1:
        return []
    d1, d4 = _rate(ones[0]), _rate(fours[0])
    unmeasured = [name for name, rate in (("c=1", d1), ("c=4", d4)) if rate is None]
    if unmeasured:
        return [f"S7 unmeasured at {' and '.join(unmeasured)} (no positive decode_tok_s)"]
    ratio = contract.decode_ratio_c4_over_c1
    if d4 >= ratio * d1:
        return []
    return [
        f"S7: decode at c=4 is {rate_text(d4)} tok/s, {share_text(100 * d4 / d1, 100 * ratio)}% of c=1's "
        f"{rate_text(d1)} tok/s; the contract needs at least {100 * ratio:g}%"
    ]


def rate_text(rate: float) -> str:
    """A decode rate to what it means: tenths of a token per second (45.2, not 45.20838614744939);
    a rate too small to show in tenths keeps three significant digits, never reading as 0."""
    return f"{rate:.1f}" if rate >= 0.05 else f"{rate:.3g}"


def share_text(percent: float, needed: float) -> str:
    """A percentage to one decimal, or more where one decimal would round a failing share up to
    the share it fails (49.96% is not "50.0%" of a 50% rule)."""
    text = f"{percent:.1f}"
    return text if float(text) < needed else f"{percent:.4g}"


def fleet_reasons(fleet: dict | None) -> list[str]:
    """A fleet (`batchproof probe --fleet`) must show its replicas bitwise equal: each replica
    passing its bands is not enough when two of them give a client different bits. Any
    contract; a witness without a fleet section has nothing here to judge."""
    if fleet is None:
        return []
    divergence = fleet["divergence"]
    if divergence is not None:
        a, b = divergence["replicas"]
        what = {"token": "tokens differ", "logprob": "logprobs differ"}.get(divergence["kind"] or "", "they differ")
        return [
            f"fleet: replicas {a} and {b} disagree on prompt {divergence['prompt']} at token "
            f"{divergence['token_index']} ({what}); a fleet's replicas must agree bitwise"
        ]
    if fleet["result"] == "PASS":
        return []
    why = f" ({fleet['reason']})" if fleet["reason"] else ""
    if fleet["result"] is None:
        return [f"fleet: result not recorded{why}; cross-replica agreement is not shown"]
    return [f"fleet: result {fleet['result']} is not PASS{why}; cross-replica agreement is not shown"]


def fail_open_reasons(fail_open: list[dict]) -> list[str]:
    """A 200 without the logprobs asked for, whatever the contract: a client that asked for logprobs
    and got none is the failure the probe exists to catch, never a pass and never unmeasurable."""
    return [
        f"fail-open: {entry['route']} ({'streamed' if entry['streamed'] else 'not streamed'}) answered "
        f"{entry['requests']} request(s) with {entry['what'] or 'no logprobs'}; a request that asks for "
        "logprobs must never get a 200 without them"
        for entry in fail_open
    ]


def reference_reasons(reference: dict | None, contract: Contract) -> list[str]:
    """The m=1 reference's two runs agree on every logprob (an optional clause): named as the
    reference's finding, so a band is never blamed for a server that varies alone."""
    if not contract.require_stable_reference or reference is None or reference["logprobs_stable"] is not False:
        return []
    why = reference["logprob_reason"] or "reference: logprobs of two alone runs differ"
    return [f"{why}; the contract does not admit an unstable reference"]


def mode_reasons(name: str, section: dict | None, contract: Contract) -> list[str]:
    """--stream-parity and --cache, whatever the contract: every attributable finding (a logprob-only
    one where the contract requires bitwise logprobs), and a mode that could not compare."""
    if section is None:
        return []
    judged = [f for f in section["findings"] if f["attributable"] is not False and f["kind"] != "refused"
              and (f["kind"] != "logprob" or contract.require_bitwise_logprobs)]
    reasons = [str(f["text"]) for f in judged]
    if section["result"] not in ("PASS", "FAIL"):
        why = f" ({section['reason']})" if section["reason"] else ""
        reasons.append(f"{name}: result {section['result'] or 'not recorded'}{why}; the mode did not compare")
    return reasons


def judge(witness: dict, contract: Contract) -> list[str]:
    """Every reason the typed `witness` is not admissible under `contract`, in the spec's order
    (the additions after identity: fail-open and the reference; after the fleet: the modes)."""
    bands, fleet = witness["bands"], witness.get("fleet")
    return [
        *model_reasons(witness["model"], contract),
        *identity_reasons(witness),
        *fail_open_reasons(witness.get("fail_open") or []),
        *reference_reasons(witness.get("reference_logprobs"), contract),
        *band_reasons(bands, contract, fleet is not None),
        *near_tie_cap_reasons(bands, contract),
        *decode_reasons(bands, contract),
        *fleet_reasons(fleet),
        *mode_reasons("stream parity", witness.get("stream_parity"), contract),
        *mode_reasons("cache", witness.get("cache"), contract),
    ]
