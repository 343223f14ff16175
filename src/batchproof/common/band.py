"""One band of a parity witness: c concurrent requests, the batch they formed, how they agreed with m=1."""

# The probe writes it and the check reads it back; neither imports the other, so it lives here.
# Slots stay JSON objects: the probe writes its own (SlotRecord), other probes' carry other keys.

from dataclasses import asdict, dataclass, field, fields
from typing import Any

MARGIN = "top2_margin_at_divergence"
_AS_READ = ("key_order", "other_keys")


@dataclass(frozen=True)
class Band:
    """A band in the witness's key order: v3's keys, then batchproof's additions."""

    c: int
    m_formed: int | None = None
    m_formed_source: str | None = None  # where m_formed was read (log, metrics, slots, gauge)
    result: str | None = None
    divergence_at: int | None = None
    top2_margin_at_divergence: float | None = None  # written by the probe only when the streams part
    intra_agree_to: int | None = None
    max_constant_run: int | None = None
    declared_min: int | None = None
    max_constant_run_declared: int | None = None
    reason: str | None = None
    decode_tok_s: float | None = None
    # Additions to v3: which slot divergence_at is from, logprob parity with m=1, whether a logprob
    # difference can be batching's, and on a fleet each replica's largest batch.
    divergence_slot: int | None = None
    logprob_max_abs_diff: float | None = None
    logprobs_bitwise_equal: bool | None = None
    logprobs_attributable: bool | None = None
    m_formed_by_replica: dict[str, int | None] | None = None
    # The probe's own CPU time over the band, as a share of the cores it may run on (0 to 1): on a
    # small machine the client competes with the server it measures, so a reader of any server's
    # witness can see how much of the band's machine the probe itself took.
    probe_cpu_share: float | None = None
    slots: list[dict[str, Any]] = field(default_factory=list)
    # A band read from a witness (read_band) keeps its keys in order and the keys other probes
    # add, so it is written back as it was read; both are empty for a band the probe made.
    key_order: tuple[str, ...] = ()
    other_keys: dict[str, Any] = field(default_factory=dict)

    def keys(self) -> tuple[str, ...]:
        """The keys the band is written with: as read, or the probe's (the margin only when set)."""
        if self.key_order:
            return self.key_order
        names = (f.name for f in fields(self) if f.name not in _AS_READ)
        return (*(n for n in names if n != MARGIN or self.top2_margin_at_divergence is not None), *self.other_keys)


def band_json(band: Band) -> dict[str, Any]:
    """The band as the witness holds it."""
    values = asdict(band)
    values |= values.pop("other_keys")
    return {key: values[key] for key in band.keys()}


def read_band(value: dict[str, Any]) -> Band:
    """A band object of a witness, its values as they are (the check types them); it must have `c`."""
    names = {f.name for f in fields(Band)} - set(_AS_READ)
    known = {key: v for key, v in value.items() if key in names}
    others = {key: v for key, v in value.items() if key not in names}
    return Band(**known, key_order=tuple(value), other_keys=others)
