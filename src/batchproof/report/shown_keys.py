"""The witness keys the page shows beyond those the check judges, each of its declared type."""

# The check reads only what it judges; the page also formats the sampler, the reference, the run's
# mode and each slot's stream and rate. A wrong type there is refused by name (exit 4) before
# drawing, as the check refuses its own keys, instead of a traceback from the middle of the page.

from batchproof.check.witness import BOOLEAN, INTEGER, NUMBER, STRING, WitnessError, shown, typed_keys, typed_value

TOP_KEYS = {"result": STRING, "mode": STRING, "route": STRING, "stagger_ms": NUMBER, "served_model": STRING,
            "declared_min": INTEGER}
SAMPLER_KEYS = {"max_tokens": INTEGER}
REFERENCE_KEYS = {"stable": BOOLEAN, "self_divergence_at": INTEGER, "reason": STRING, "tokens": INTEGER}
REFERENCE_LOGPROB_KEYS = {"logprobs_stable": BOOLEAN, "logprob_reason": STRING}
# Additions of issue 27: each reference per prompt, the pairs the modes compared, what failed open.
PROMPT_REFERENCE_KEYS = {"stable": BOOLEAN, "self_divergence_at": INTEGER, "logprob_max_abs_diff": NUMBER,
                         "logprobs_bitwise_equal": BOOLEAN, "logprob_first_diff_at": INTEGER}
PAIR_KEYS = {"refused": STRING, "tokens_agree_to": INTEGER, "text_equal": BOOLEAN, "logprob_max_abs_diff": NUMBER,
             "logprobs_bitwise_equal": BOOLEAN, "logprob_first_diff_at": INTEGER, "attributable": BOOLEAN,
             "not_attributable": STRING}
CACHE_SLOT_KEYS = PAIR_KEYS | {"c": INTEGER, "i": INTEGER, "cached_tokens": INTEGER}
RUN_KEYS = {"cached_tokens": INTEGER, "completion_tokens": INTEGER, "refused": STRING}
SECTION_KEYS = {"result": STRING, "reason": STRING}
BAND_KEYS = {"m_formed_source": STRING, "reason": STRING, "probe_cpu_share": NUMBER}
SLOT_KEYS = {"refused": STRING, "prompt": INTEGER, "stream_mode": STRING, "stream_mode_conflict": STRING,
             "decode_tok_s": NUMBER}


def check_shown_keys(witness: dict) -> None:
    """Refuse (WitnessError) a shown key of the wrong type; `witness` has passed parse_witness,
    so it is an object whose bands are objects and whose slots are lists of objects or null."""
    typed_keys(witness, TOP_KEYS, "")
    typed_keys(witness.get("sampler"), SAMPLER_KEYS, "sampler")
    typed_keys(witness.get("reference"), REFERENCE_KEYS, "reference")
    typed_keys(witness.get("reference_logprobs"), REFERENCE_LOGPROB_KEYS, "reference_logprobs")
    prompts = witness.get("prompts")
    if prompts is not None and not isinstance(prompts, list):
        raise WitnessError(f"prompts must be a list or null, got {shown(prompts)}")
    for i, item in enumerate(_objects(witness.get("references"), "references")):
        typed_keys(item, PROMPT_REFERENCE_KEYS, f"references[{i}]")
        _typed_list(item.get("cached_tokens"), INTEGER, f"references[{i}].cached_tokens")  # one per run
    for name, kind, what in (("dropped_fields", list, "a list"), ("extra_body", dict, "an object")):
        if witness.get(name) is not None and not isinstance(witness[name], kind):
            raise WitnessError(f"{name} must be {what} or null, got {shown(witness[name])}")
    parity = typed_keys(witness.get("stream_parity"), SECTION_KEYS, "stream_parity")
    if parity is not None:
        for i, pair in enumerate(_objects(witness["stream_parity"].get("pairs"), "stream_parity.pairs")):
            typed_keys(pair, PAIR_KEYS, f"stream_parity.pairs[{i}]")
    if typed_keys(witness.get("cache"), SECTION_KEYS, "cache") is not None:
        for c, case in enumerate(_objects(witness["cache"].get("cases"), "cache.cases")):
            for run in ("cold", "warmer"):
                typed_keys(case.get(run), RUN_KEYS, f"cache.cases[{c}].{run}")
            for i, slot in enumerate(_objects(case.get("slots"), f"cache.cases[{c}].slots")):
                typed_keys(slot, CACHE_SLOT_KEYS, f"cache.cases[{c}].slots[{i}]")
    for b, band in enumerate(witness.get("bands") or []):  # none, with a fail-open
        typed_keys(band, BAND_KEYS, f"bands[{b}]")
        for s, slot in enumerate(band.get("slots") or []):
            typed_keys(slot, SLOT_KEYS, f"bands[{b}].slots[{s}]")


def _typed_list(value: object, kind: str, where: str) -> list:
    """A list (absent or null: empty) whose items are each of `kind` or null, refused by name otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise WitnessError(f"{where} must be a list or null, got {shown(value)}")
    return [typed_value(item, kind, f"{where}[{i}]") for i, item in enumerate(value)]


def _objects(value: object, where: str) -> list[dict]:
    """A list of objects (absent or null: none), refused by name otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise WitnessError(f"{where} must be a list of objects or null, got {shown(value)}")
    return value
