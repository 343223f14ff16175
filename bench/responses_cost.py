"""What the Responses API costs over the chat route: the same 16 greedy streamed conversations with
logprobs through /v1/chat/completions and through /v1/responses, at once, rounds interleaved.

    python bench/responses_cost.py --url http://127.0.0.1:8080 [--rounds 3] [--tokens 64] [--out FILE]

Prints, per route, the median over rounds of the aggregate decode rate (tokens / wall time of the
round) and of the time to the first text; and whether every reply's tokens and logprobs were
bitwise the same through both routes.
"""

import argparse
import asyncio
import json
import statistics
import time

import httpx

PROMPTS = [f"Write a short story about a {thing}." for thing in (
    "lighthouse", "fox", "robot", "garden", "river", "train", "violin", "mountain",
    "kite", "library", "comet", "bakery", "glacier", "harbor", "lantern", "desert")]


def _body(route: str, prompt: str, tokens: int) -> dict:
    common = {"temperature": 0, "stream": True, "ignore_eos": True}
    if route == "chat":
        return {**common, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "logprobs": True, "top_logprobs": 2}
    return {**common, "input": prompt, "max_output_tokens": tokens, "include": ["message.output_text.logprobs"],
            "top_logprobs": 2}


async def _one(client: httpx.AsyncClient, url: str, route: str, prompt: str, tokens: int) -> tuple[float, list]:
    path = "/v1/chat/completions" if route == "chat" else "/v1/responses"
    started, first, entries = time.perf_counter(), None, []
    async with client.stream("POST", url + path, json=_body(route, prompt, tokens)) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if route == "chat":
                choice = (event.get("choices") or [{}])[0]
                got = (choice.get("logprobs") or {}).get("content") or []
            else:
                got = event.get("logprobs") or [] if event.get("type") == "response.output_text.delta" else []
            if got and first is None:
                first = time.perf_counter() - started
            entries += [(e["token"], e["logprob"], [t["logprob"] for t in e["top_logprobs"]]) for e in got]
    return first or 0.0, entries


async def _round(url: str, route: str, tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        replies = await asyncio.gather(*(_one(client, url, route, p, tokens) for p in PROMPTS))
        wall = time.perf_counter() - started
    return {"tok_s": sum(len(e) for _, e in replies) / wall, "ttft_s": statistics.median(f for f, _ in replies),
            "entries": [e for _, e in replies]}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"chat": [], "responses": []}
    for _ in range(args.rounds):
        for route in runs:  # interleaved: the machine's drift falls on both alike
            runs[route].append(await _round(args.url, route, args.tokens))
    same = all(c["entries"] == r["entries"] for c, r in zip(runs["chat"], runs["responses"]))
    result = {route: {"tok_s_median": statistics.median(r["tok_s"] for r in rounds),
                      "ttft_s_median": statistics.median(r["ttft_s"] for r in rounds),
                      "tok_s": [round(r["tok_s"], 1) for r in rounds]} for route, rounds in runs.items()}
    result["responses_over_chat"] = result["responses"]["tok_s_median"] / result["chat"]["tok_s_median"]
    result["bitwise_same_entries"] = same
    result["protocol"] = {"concurrency": len(PROMPTS), "tokens": args.tokens, "rounds": args.rounds}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
