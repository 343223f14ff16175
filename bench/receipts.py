"""What receipts cost (docs/receipts.md), on the default model (or --model), CPU:

    python bench/receipts.py [--model PATH] [--replies 16] [--tokens 32] [--rounds 3] [--url URL]

(a) Attaching: each reply's receipt built as the server builds it (the model facts once per
request, the params, the outcome and the logprob digest) against the time the reply took, the
--replies generated together (half greedy, half seeded; all with 2 alternatives a token). With
--url (a running server), also end to end: the same requests at once with `receipt: true` and
without, rounds interleaved, median wall time of a round each.
(b) Re-executing: verify-receipt's in-process route over the same receipts (each replayed along
its own tokens in one prefill, commands/receipts/replay.py) against prefilling their tokens
(prompt + reply + end token, nothing generated, nothing scored). The prefix cache is off, so
neither side reuses what the other computed. Prints one JSON object.
"""

import argparse
import concurrent.futures
import json
import statistics
import time
from pathlib import Path

from batchproof.commands.receipts.local import LocalHost
from batchproof.commands.receipts.reexecute import reexecute
from batchproof.commands.receipts.scoring import is_scorable
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.rollout_scoring import score_prompts
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.receipts.verdict import Kind, judge
from batchproof.server.reply.receipt import choice_receipt
from batchproof.server.reply.receipt_facts import host_facts

TOPICS = ["the sea", "a fox", "robots", "a garden", "rivers", "trains", "violins", "mountains", "kites",
          "libraries", "comets", "bread", "glaciers", "harbours", "lanterns", "deserts"]


def _requests(engine: Engine, count: int, tokens: int) -> dict[str, tuple[list[int], SamplingParams]]:
    requests = {}
    for i in range(count):
        prompt = engine.chat_prompt_ids([{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}])
        sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 1000 + i} if i % 2 else {"temperature": 0.0}
        requests[f"r{i}"] = (prompt, SamplingParams(max_tokens=tokens, top_logprobs=2, **sampled))
    return requests


def attach_cost(engine: Engine, requests: dict) -> tuple[list[dict], dict]:
    """The replies' receipts, and what building them cost against what generating them took."""
    started = time.perf_counter()
    deltas = engine.generate(requests)
    reply_s = time.perf_counter() - started  # each reply ran the whole batch's time
    front = engine.front
    receipts, build_s = [], []
    for request_id, (prompt, params) in requests.items():
        times = []
        for _ in range(20):
            began = time.perf_counter()
            facts = host_facts(engine.info(), front.tokenizer, front.chat_template)  # once per request
            model = {"sha256": facts["model_sha256"], "numerics_id": facts["numerics_id"],
                     "tokenizer_sha256": facts["tokenizer_sha256"],
                     "chat_template_sha256": facts["chat_template_sha256"]}
            receipt = choice_receipt(model, prompt, params, deltas[request_id])
            times.append(time.perf_counter() - began)
        receipts.append(receipt)
        build_s.append(statistics.median(times))
    per_receipt = statistics.median(build_s)
    return receipts, {"replies": len(requests), "reply_s": round(reply_s, 3),
                      "tokens": sum(len(r["output_token_ids"]) for r in receipts),
                      "receipt_ms_median": round(per_receipt * 1e3, 3),
                      "receipt_share_of_reply": per_receipt / reply_s}


def reexecution_cost(engine: Engine, receipts: list[dict], rounds: int) -> dict:
    host = LocalHost(engine)
    facts = host.facts()
    prefills = [(r["prompt_token_ids"] + r["output_token_ids"] + ([r["end_token_id"]] if r["end_token_id"] is not None
                                                                  else []),
                 SamplingParams(temperature=0.0, max_tokens=0, cache_namespace=None)) for r in receipts]
    timed: dict[str, list[float]] = {"reexecute": [], "prefill": [], "reexecute_scored": [], "prefill_scored": []}
    scored = [r for r in receipts if is_scorable(r)]
    scored_prefills = [p for p, r in zip(prefills, receipts) if is_scorable(r)]
    for _ in range(rounds):  # interleaved: the machine's drift falls on both alike
        for name, run in (("reexecute", lambda: reexecute(receipts, host, facts)),
                          ("prefill", lambda: score_prompts(engine, prefills)),
                          ("reexecute_scored", lambda: reexecute(scored, host, facts)),
                          ("prefill_scored", lambda: score_prompts(engine, scored_prefills))):
            started = time.perf_counter()
            result = run()
            timed[name].append(time.perf_counter() - started)
            if name == "reexecute":
                assert all(judge(r, facts, o).kind == Kind.MATCH for r, o in zip(receipts, result))
    medians = {name: statistics.median(values) for name, values in timed.items()}
    return {"receipts": len(receipts), "scored_by_prefill": len(scored),
            "reexecute_s": round(medians["reexecute"], 3), "prefill_s": round(medians["prefill"], 3),
            "reexecute_over_prefill": medians["reexecute"] / medians["prefill"],
            "scored_only": {"reexecute_s": round(medians["reexecute_scored"], 3),
                            "prefill_s": round(medians["prefill_scored"], 3),
                            "reexecute_over_prefill": medians["reexecute_scored"] / medians["prefill_scored"]}}


def http_cost(url: str, count: int, tokens: int, rounds: int) -> dict:
    """The same requests at once, with and without receipts, rounds interleaved."""
    import httpx

    def body(i: int, receipt: bool) -> dict:
        sampled = {"temperature": 0.8, "seed": 1000 + i} if i % 2 else {"temperature": 0}
        return {"messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}],
                "max_tokens": tokens, "logprobs": True, "top_logprobs": 2, "receipt": receipt, **sampled}

    def one_round(receipt: bool) -> float:
        with httpx.Client(base_url=url, timeout=600) as client, concurrent.futures.ThreadPoolExecutor(count) as pool:
            started = time.perf_counter()
            replies = list(pool.map(lambda i: client.post("/v1/chat/completions", json=body(i, receipt)),
                                    range(count)))
            wall = time.perf_counter() - started
        assert all(r.status_code == 200 and ("receipt" in r.json()["choices"][0]) == receipt for r in replies)
        return wall

    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for receipt in (False, True):
            walls[receipt].append(one_round(receipt))
    with_s, without_s = statistics.median(walls[True]), statistics.median(walls[False])
    return {"concurrency": count, "with_receipts_s": round(with_s, 3), "without_s": round(without_s, 3),
            "with_over_without": with_s / without_s,
            "rounds": {"with": [round(w, 3) for w in walls[True]], "without": [round(w, 3) for w in walls[False]]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--replies", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="also time receipts end to end on this running server")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, device="cpu", prefix_cache=False))
    requests = _requests(engine, args.replies, args.tokens)
    receipts, attach = attach_cost(engine, requests)
    result = {"model": engine.model_path.name, "attach": attach,
              "reexecute": reexecution_cost(engine, receipts, args.rounds)}
    if args.url:
        result["attach_http"] = http_cost(args.url, args.replies, args.tokens, args.rounds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
