"""Tiny random mixtures of experts written by transformers (Qwen3-MoE with a dense layer,
OLMoE, Mixtral), served from their directories: our greedy tokens and logprobs against
transformers' float32 forward, and the experts each position is routed to, layer by layer."""

import pytest
import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.moe import layer as moe_layer
from batchproof.engine.sampling.params import SamplingParams
from tests.engine.moe_checkpoints import MOE_CONFIGS, reference_routes, write_moe_checkpoint
from tests.hf.checkpoints import reference_logprobs

PROMPTS = ["hello the world, and then", "  two  spaces\n\nand\ttabs", "123 456 789", "the end and the"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, top_logprobs=3, ignore_eos=True)
ATOL = 1e-4  # tests/hf/checkpoints.py's greedy_check, the dense checkpoints' tolerance


def greedy_check(records: list, reference: torch.Tensor, prompt_len: int, banned: list[int]) -> None:
    """tests/hf's greedy_check under ignore_eos: the choice is the best token but the ends of turn
    (the tiny models here rank one first now and then); every logprob within ATOL."""
    worst = 0.0
    for i, record in enumerate(records):
        row = reference[prompt_len - 1 + i]
        best = int(row.clone().index_fill_(0, torch.tensor(banned), float("-inf")).argmax())
        assert record.token_id == best, f"step {i}: we chose {record.token_id}, not {best}"
        for entry in (record, *record.top):
            worst = max(worst, abs(entry.logprob - float(row[entry.token_id])))
    assert worst <= ATOL, f"logprobs differ from transformers' by {worst}"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: write_moe_checkpoint(name, root / name) for name in MOE_CONFIGS}


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_greedy_tokens_logprobs_and_routes_equal_transformers(name, checkpoints, monkeypatch):
    directory = checkpoints[name]
    # Neither drafts nor cached prefixes: each forward's rows are then the next positions, in order.
    engine = Engine(EngineConfig(model_path=directory, device="cpu", max_batch=4, num_threads=1,
                                 prefix_cache=False, speculative=False))
    # Op by op, so every forward's routing passes through moe/layer.py's route, recorded here: the
    # fused decode step's routing (moe.c) gives its bits (test_moe_invariance).
    engine.model.ops.is_fused = False
    spec = engine.model.spec
    num_moe = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
    routes: list[torch.Tensor] = []

    def recording_route(*args):
        ids, weights = route(*args)
        routes.append(ids)
        return ids, weights

    route = moe_layer.route
    monkeypatch.setattr(moe_layer, "route", recording_route)
    special = engine.tokenizer.ids
    banned = sorted({special.eos_id, *special.end_of_turn_ids} - {None})
    for text in PROMPTS:
        routes.clear()
        prompt = engine.tokenizer.encode(text, add_bos=False)
        out = engine.generate({"a": (prompt, GREEDY)})["a"]
        got = [r for delta in out for r in delta.records]
        ids = prompt + [r.token_id for r in got]
        greedy_check(got, reference_logprobs(directory, ids), len(prompt), banned)
        # Each forward routes its rows through the MoE layers in order (the last token may be fed
        # too, before the engine stops: compared up to the reference's positions).
        theirs = reference_routes(directory, ids[:-1])
        ours = [torch.cat(routes[layer::num_moe])[:len(ids) - 1] for layer in range(num_moe)]
        assert len(theirs) == num_moe
        for layer, (a, b) in enumerate(zip(ours, theirs)):
            assert torch.equal(a, b), f"{name} MoE layer {layer}: routes differ at positions " \
                                      f"{(a != b).any(-1).nonzero().flatten().tolist()}"
