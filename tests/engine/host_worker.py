"""One simulated host, in its own process (tests/engine/test_host_simulation.py): torch's vector
level set by ATEN_CPU_CAPABILITY before torch loads, our kernels capped with --max-isa, as a
real host differs from another in both at once. It runs a mixed batch on each model and
numerics asked for and prints every bit it returned as JSON on its last line:
`python -m tests.engine.host_worker ISA MODEL:NUMERICS ...`."""

import json
import struct
import sys

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams

PROMPTS = ["The lighthouse keeper wrote in his log that", "List three rivers of Europe:", "1, 1, 2, 3, 5, 8,"]


def requests() -> dict[str, tuple[str, SamplingParams]]:
    """Greedy and seeded, with penalties, top-k, top-p and min-p, top-20, tail and prompt logprobs."""
    return {
        "greedy": (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8, top_logprobs=20, prompt_logprobs=3,
                                              ignore_eos=True)),
        "seeded": (PROMPTS[1], SamplingParams(temperature=0.9, top_p=0.85, top_k=40, seed=1234, max_tokens=8,
                                              top_logprobs=20, logprobs_mode="processed", ignore_eos=True,
                                              repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3)),
        "seeded-min-p": (PROMPTS[2], SamplingParams(temperature=1.3, min_p=0.05, seed=99, max_tokens=8,
                                                    top_logprobs=5, tail_logprobs=True, ignore_eos=True,
                                                    logit_bias={11: 2.5})),
        "hot": (PROMPTS[0], SamplingParams(temperature=1.0, seed=7, max_tokens=8, top_logprobs=3, ignore_eos=True)),
    }


def hexed(x: float | None) -> str | None:
    return None if x is None else struct.pack(">f", x).hex()


def record_bits(record) -> list:
    if record is None:
        return [None]
    return [record.token_id, hexed(record.logprob), [(t.token_id, hexed(t.logprob)) for t in record.top],
            hexed(record.tail)]


def run(model: str, numerics: str, isa: str) -> dict:
    engine = Engine(EngineConfig(model_path=model, device="cpu", numerics=numerics, max_isa=isa, max_batch=4,
                                 speculative=False))
    batch = {rid: (engine.tokenizer.encode(text), params) for rid, (text, params) in requests().items()}
    out = engine.generate(batch)
    return {rid: {"tokens": [t for o in deltas for t in o.token_ids],
                  "records": [record_bits(r) for o in deltas for r in o.records],
                  "prompt": [record_bits(r) for o in deltas for r in (o.prompt_records or [])]}
            for rid, deltas in out.items()}


def main(argv: list[str]) -> None:
    isa, runs = argv[0], argv[1:]
    results = {}
    for spec in runs:
        model, numerics = spec.rsplit(":", 1)
        results[spec] = run(model, numerics, isa)
    import torch  # noqa: PLC0415  (imported by the engine already: only its capability is read here)

    print(json.dumps({"torch": torch.backends.cpu.get_cpu_capability(), "results": results}))


if __name__ == "__main__":
    main(sys.argv[1:])
