"""The model facts a receipt names (docs/receipts.md): the weights' sha256, the numerics id, and
hashes of the tokenizer and the chat template, each computed from what the model's front holds,
so any host holding the same files computes the same ones."""

import functools
import hashlib
import json
from collections.abc import Callable

from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.engine.weight_versions import default_version
from batchproof.notary.receipts.format import canonical
from batchproof.server.engine_client import Backend
from batchproof.server.info import numerics_id

# The parts of the `tokenizers` pipeline that turn text into ids. Others (padding, truncation,
# the decoder) decide no id, and fields a newer release of the library adds would change the hash
# with no token changed.
PIPELINE_PARTS = ("normalizer", "pre_tokenizer")


def _merges(model: dict) -> list[str]:
    # tokenizers 0.20 writes a merge as ["a", "b"], older releases as "a b": one spelling here.
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


@functools.lru_cache(maxsize=4)  # per tokenizer (its identity): ~0.15 s for a 49k vocabulary, then free
def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """sha256 over every id's spelling and bytes (length-prefixed, in id order), the special ids
    and end-of-turn ids, whether BOS is added, and the pipeline's normalizer, pre-tokenizer,
    model type and merges as canonical JSON."""
    digest = hashlib.sha256(b"batchproof-tokenizer-v1\n")
    for token_id in range(tokenizer.vocab_size):
        spelling = tokenizer.spelling(token_id).encode("utf-8", errors="surrogatepass")
        raw = tokenizer.decode_bytes(token_id)
        digest.update(len(spelling).to_bytes(4, "big") + spelling + len(raw).to_bytes(4, "big") + raw)
    ids = tokenizer.ids
    pipeline = json.loads(tokenizer.serialized())
    model = pipeline.get("model") or {}
    digest.update(canonical({
        "special_ids": sorted(tokenizer.special_ids), "bos_id": ids.bos_id, "eos_id": ids.eos_id,
        "end_of_turn_ids": sorted(ids.end_of_turn_ids), "add_bos": ids.add_bos, "pad_id": ids.pad_id,
        **{part: pipeline.get(part) for part in PIPELINE_PARTS},
        "model": {"type": model.get("type"), "merges": _merges(model)},
    }))
    return digest.hexdigest()


def template_sha256(template: ChatTemplate | None) -> str | None:
    """sha256 of the template's Jinja source and the BOS and EOS spellings it is rendered with."""
    if template is None:
        return None
    return hashlib.sha256(canonical([template.source, template.bos_token, template.eos_token])).hexdigest()


def host_facts(info: dict, tokenizer: Tokenizer, template: ChatTemplate | None) -> dict:
    """What a verifying host (or a server, of itself) holds, as verdict.judge compares it."""
    return {"model_sha256": info["model_sha256"], "numerics_id": numerics_id(info),
            "tokenizer_sha256": tokenizer_sha256(tokenizer), "chat_template_sha256": template_sha256(template),
            "max_model_len": info["max_model_len"]}


def served_version(backend: Backend, model_sha256: str) -> str:
    """The weight version serving now (a fleet's replicas keep the file's default label)."""
    if backend.control is not None:
        return backend.control.weight_info()["weight_version"]
    return default_version(model_sha256)


def model_facts(backend: Backend, uses_template: bool) -> Callable[[], tuple[dict, str]]:
    """What a ReceiptBook reads when a request's first choice ends: the model facts its receipts
    name (the template's hash only where a template rendered the prompt: not for ids sent as the
    prompt), and the weight version serving then."""

    def read() -> tuple[dict, str]:
        client = backend.engine
        facts = host_facts(client.info(), client.front.tokenizer, client.front.chat_template)
        model = {"sha256": facts["model_sha256"], "numerics_id": facts["numerics_id"],
                 "tokenizer_sha256": facts["tokenizer_sha256"],
                 "chat_template_sha256": facts["chat_template_sha256"] if uses_template else None}
        return model, served_version(backend, facts["model_sha256"])

    return read
