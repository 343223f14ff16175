"""The fallback path (no compiled kernels, e.g. a machine without a C compiler, or a GPU):
torch matmuls with every decode step padded to max_batch rows is batch-invariant too,
logprobs included (the ops are chosen once at load, so its records run torch's normaliser)."""

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import TorchOps, kernels
from batchproof.engine.sampling.params import SamplingParams

PROMPTS = ["Hi", "Write an essay on compilers.", "List the planets of the solar system with one fact each.",
           "What is 2 + 2?"]


def signature(outputs) -> list[tuple]:
    return [(r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
            for out in outputs for r in out.records]


@pytest.fixture(scope="module")
def torch_engine():
    kernels._library.cache_clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "available", lambda: False)
        engine = Engine(EngineConfig(device="cpu", max_batch=4))
    assert isinstance(engine.model.ops, TorchOps) and "padded" in engine.info()["decode_path"]
    assert engine.outputs.records_backend == engine.model.ops.normalizer_and_top_k
    return engine


def test_padded_torch_path_is_batch_invariant(torch_engine):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, top_logprobs=3)
    ids = [torch_engine.chat_prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    alone = [signature(torch_engine.generate({"a": (i, params)})["a"]) for i in ids]
    batch = torch_engine.generate({f"b{k}": (i, params) for k, i in enumerate(reversed(ids))})
    for k, i in enumerate(reversed(range(len(ids)))):
        assert signature(batch[f"b{k}"]) == alone[i]
    pair = torch_engine.generate({"p0": (ids[2], params), "p1": (ids[0], params)})
    assert signature(pair["p0"]) == alone[2] and signature(pair["p1"]) == alone[0]
