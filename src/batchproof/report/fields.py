"""The witness keys the page shows beyond those the check judges, each of its declared type."""

# The check reads only what it judges; the page also formats the sampler, the reference, the run's
# mode and each slot's stream and rate. A wrong type there is refused by name (exit 4) before
# drawing, as the check refuses its own keys, instead of a traceback from the middle of the page.

from batchproof.check.witness import BOOLEAN, INTEGER, NUMBER, STRING, WitnessError, shown, typed_keys

TOP_KEYS = {"result": STRING, "mode": STRING, "route": STRING, "stagger_ms": NUMBER, "served_model": STRING,
            "declared_min": INTEGER}
SAMPLER_KEYS = {"max_tokens": INTEGER}
REFERENCE_KEYS = {"stable": BOOLEAN, "self_divergence_at": INTEGER, "reason": STRING}
BAND_KEYS = {"m_formed_source": STRING, "reason": STRING}
SLOT_KEYS = {"refused": STRING, "prompt": INTEGER, "stream_mode": STRING, "stream_mode_conflict": STRING,
             "decode_tok_s": NUMBER}


def check_shown_keys(witness: dict) -> None:
    """Refuse (WitnessError) a shown key of the wrong type; `witness` has passed parse_witness,
    so it is an object whose bands are objects and whose slots are lists of objects or null."""
    typed_keys(witness, TOP_KEYS, "")
    typed_keys(witness.get("sampler"), SAMPLER_KEYS, "sampler")
    typed_keys(witness.get("reference"), REFERENCE_KEYS, "reference")
    prompts = witness.get("prompts")
    if prompts is not None and not isinstance(prompts, list):
        raise WitnessError(f"prompts must be a list or null, got {shown(prompts)}")
    for b, band in enumerate(witness["bands"]):
        typed_keys(band, BAND_KEYS, f"bands[{b}]")
        for s, slot in enumerate(band.get("slots") or []):
            typed_keys(slot, SLOT_KEYS, f"bands[{b}].slots[{s}]")
