"""Behaviours a hand-made bug in each once survived the whole suite (issue 37): the prefill pacer
fed the tokens a step prefilled (the chunked-prefill test replaces its budget, so nothing else
runs this wiring), and a GGUF merge whose pieces are not tokens refused at load."""

from pathlib import Path

import gguf
import numpy as np
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.tiny_gguf import MERGES, write_tiny_gguf


def test_the_pacer_is_fed_the_tokens_a_prefill_step_fed(engine, monkeypatch) -> None:
    """Two prompts prefilled in one step (nothing decodes, so the step takes both whole): the
    pacer's rate is their tokens over the step's time, never their count of 2."""
    seen: list[int] = []
    observe_prefill = engine.scheduler.pacer.observe_prefill

    def spy(num_tokens: int, seconds: float) -> None:
        seen.append(num_tokens)
        observe_prefill(num_tokens, seconds)

    monkeypatch.setattr(engine.scheduler.pacer, "observe_prefill", spy)
    one, other = engine.tokenizer.encode("word " * 30), engine.tokenizer.encode("more " * 11)
    params = SamplingParams(temperature=0, max_tokens=1, cache_namespace=None)  # every position computed
    engine.generate({"one": (one, params), "other": (other, params)})
    assert seen == [len(one) + len(other)]


# Merges of the tiny vocabulary rewritten in place, each as long as the one it replaces.
BAD_MERGES = {
    "left piece not a token": "hel l",  # the join "hell" is a token; "hel" is not
    "right piece not a token": "h ell",
    "join not a token": "ll he",
    "no space": "he+ll",
}


@pytest.mark.parametrize("merge", BAD_MERGES.values(), ids=BAD_MERGES.keys())
def test_a_merge_that_is_not_two_tokens_is_refused_at_load(tmp_path: Path, merge: str) -> None:
    """The BPE library would raise a bare exception of its own, naming no key."""
    index = MERGES.index(("he", "ll"))
    path = tmp_path / "bad-merge.gguf"
    write_tiny_gguf(path)
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["tokenizer.ggml.merges"]
    assert bytes(field.parts[field.data[index]]) == b"he ll" and len(merge) == len("he ll")
    field.parts[field.data[index]][:] = np.frombuffer(merge.encode(), dtype=np.uint8)
    reader.data.flush()
    del reader
    with pytest.raises(ModelLoadError) as caught:
        Engine(EngineConfig(model_path=path, device="cpu"))
    message = str(caught.value)
    assert "\n" not in message and f"tokenizer.ggml.merges[{index}]" in message, message
    assert "is not two tokens whose join is a token" in message, message
