"""What is built over a model's weights (the fused decode's description of its layers) is keyed by
the weights' identity, never by an address: CPython gives a freed object's address to the next
ones made, so after two swaps in a row (the new model where an old one was) an address key would
run the freed weights' description. Here every address collides (the worst case, made rather
than waited for), and the swapped engine still gives, bit for bit, what an engine that loaded the
new weights gives."""

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import KernelOps, kernel_ops
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf

CONFIG = {"device": "cpu", "max_batch": 2, "num_threads": 1}


def _reply(engine: Engine, prompt: list[int]) -> tuple[list[int], list[float]]:
    """A greedy reply's ids and logprobs: its decode steps run the fused layers."""
    params = SamplingParams(max_tokens=8, ignore_eos=True, top_logprobs=1, temperature=0)
    outs = engine.generate({"r": (prompt, params)})["r"]
    return [t for o in outs for t in o.token_ids], [r.logprob for o in outs for r in o.records]


def test_two_swaps_in_a_row_serve_the_new_weights_when_addresses_are_reused(tmp_path, monkeypatch):
    paths = []
    for seed in (0, 1, 2):
        paths.append(tmp_path / f"tiny-{seed}.gguf")
        write_tiny_gguf(paths[-1], TinySpec("llama", seed=seed))
    monkeypatch.setattr(kernel_ops, "id", lambda obj: 0, raising=False)  # every object at one address
    swapped = Engine(EngineConfig(model_path=paths[0], **CONFIG))
    assert isinstance(swapped.model.ops, KernelOps) and swapped.model.ops.is_fused
    prompt = swapped.tokenizer.encode("hello the world and", add_bos=False)
    first = _reply(swapped, prompt)  # the first weights described
    for path in paths[1:]:  # two swaps, no decode step between them
        swapped.install_weights(swapped.prepare_weights(path))
    loaded = _reply(Engine(EngineConfig(model_path=paths[2], **CONFIG)), prompt)
    assert _reply(swapped, prompt) == loaded
    assert loaded[1] != first[1]  # the weights differ: a stale description would show
