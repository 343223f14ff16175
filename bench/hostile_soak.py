"""Hostile soak: 15 clients measure their per-token latency while a 16th sends hostile requests.

    python bench/hostile_soak.py [--clients 15] [--seconds 60] [--tokens 32]

Starts `batchproof serve` (with --max-logit-bias at the vocabulary's size, so the hostile
client may bias every token), then runs the same soak twice, interleaved (quiet, hostile,
quiet, hostile): the measuring clients stream greedy chat replies of --tokens tokens and
record, per request, (last token's arrival - first token's arrival) / (tokens - 1). The
hostile client cycles through `hostile_requests` (each with the statuses it must get): a bias
on every token; the largest body the server reads; a body over --max-request-mb; the longest
prompt that fits; and issue 36's requests, each refused before the work it would cost: a
40 KB grammar of newlines, an empty grammar, a history call whose arguments nest 100,000 deep,
140,000 tool messages, 1,500,000 prompts, 20,000 tools under `required`, Responses metadata of
300,000 keys; then constrained requests (n = 4 under a JSON schema) it hangs up on after 0.5 s.
Reported: the measuring clients' median per-token latency in each run and the ratio hostile /
quiet (the target: at most 1.5), /health's worst answer time, and each hostile request's
statuses and slowest answer (the target: 1 s).

tests/server/test_hostile_soak.py runs one short pass of the same code against a live server
and asserts what it can without a clock: every hostile request gets its status, the quiet
clients' replies all complete, and the server ends idle and healthy.
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from batchproof.common.wire import DONE, SSEReader  # noqa: E402

WORDS = "compiler parser token lattice harbor winter garden signal river market orbit lantern".split()
HANG_UP_AFTER_S = 0.5  # a constrained request's client leaves while its grammars compile or run
PET_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "kind": {"enum": ["cat", "dog", "fish"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}},
    "required": ["name", "kind", "age", "tags"], "additionalProperties": False}


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes
    expect: frozenset[int]  # the statuses a well-defended server answers; empty: the client hangs up


@dataclass
class HostileLog:
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> status (or error) -> count
    slowest_s: dict[str, float] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)  # "name: status" for each answer outside `expect`

    def note(self, hostile: Hostile, outcome: str, took_s: float) -> None:
        counts = self.statuses.setdefault(hostile.name, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        self.slowest_s[hostile.name] = max(self.slowest_s.get(hostile.name, 0.0), took_s)
        if hostile.expect and (not outcome.isdigit() or int(outcome) not in hostile.expect):
            self.unexpected.append(f"{hostile.name}: {outcome}")


def _chat(content: str = "hi", **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], **fields}


def _tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "description": "a tool",
                                             "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}


def issue36_requests() -> list[Hostile]:
    """Issue 36's table: each must be refused (4xx) before the work it would cost."""
    bad = frozenset({400, 413, 422})
    nested_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": "[" * 100_000}}]}
    tool_flood = [{"role": "user", "content": "go"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": "{}"}}]}]
    tool_flood += [{"role": "tool", "tool_call_id": "c1", "content": "r"}] * 140_000  # 7.7 MB, under the 8 MB limit
    requests = [
        ("grammar of 20,000 newlines", "/v1/chat/completions",
         _chat(max_tokens=4, structured_outputs={"grammar": "\n" * 20_000})),
        ("empty grammar", "/v1/chat/completions", _chat(max_tokens=4, structured_outputs={"grammar": ""})),
        ("call arguments nested 100,000 deep", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "go"}, nested_call,
                       {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 4}),
        ("140,000 tool messages", "/v1/chat/completions", {"messages": tool_flood, "max_tokens": 4}),
        ("1,500,000 prompts", "/v1/completions", {"prompt": ["a"] * 1_500_000, "max_tokens": 1}),
        ("20,000 tools, required", "/v1/chat/completions",
         _chat(max_tokens=4, tools=[_tool(i) for i in range(20_000)], tool_choice="required")),
        ("metadata of 300,000 keys", "/v1/responses",
         {"input": "hi", "max_output_tokens": 4, "metadata": {f"k{i}": "v" for i in range(300_000)}}),
    ]
    return [Hostile(name, path, json.dumps(body).encode(), bad) for name, path, body in requests]


def _rollout(logprobs: str = "[-0.5, -1.0]", **fields: str) -> bytes:
    """A notary body with one rollout of 2 completion tokens, its numbers written as raw JSON
    (1e400 and 10**400 have no Python float to dump)."""
    extra = "".join(f', "{k}": {v}' for k, v in fields.items() if k != "top_logprobs")
    top = f', "top_logprobs": {fields["top_logprobs"]}' if "top_logprobs" in fields else ""
    return (f'{{"rollouts": [{{"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5], '
            f'"logprobs": {logprobs}{top}}}]{extra}}}').encode()


def issue58_requests() -> list[Hostile]:
    """Issue 58's table: the notary's numbers and sizes, and bodies whose nested lists no field
    count reached. Each a 400 naming what it holds (or a 200 where the number is a real claim)."""
    bad, ok = frozenset({400}), frozenset({200})
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 288_938}], "max_tokens": 1}
    stops = _chat(max_tokens=1, stop=["a"] * 1_500_000)
    return [
        Hostile("notary: 3,000,000 tis_caps", "/v1/verify_rollouts",
                _rollout(tis_caps=json.dumps([2] * 3_000_000, separators=(",", ":"))), bad),
        Hostile("notary: -9999 claims", "/v1/verify_rollouts", _rollout("[-9999, -9999]"), ok),
        Hostile("notary: near_tie 1e400", "/v1/verify_rollouts", _rollout(near_tie="1e400"), bad),
        Hostile("notary: near_tie 10**400", "/v1/verify_rollouts", _rollout(near_tie=str(10**400)), bad),
        Hostile("notary: a logprob of -10**400", "/v1/verify_rollouts", _rollout(f"[-{10**400}, -1.0]"), bad),
        Hostile("notary: a top_logprobs key of '²'", "/v1/verify_rollouts",
                _rollout(top_logprobs='[{"\u00b2": -1.0}, null]'), bad),
        Hostile("288,938 content parts", "/v1/chat/completions", json.dumps(parts, separators=(",", ":")).encode(),
                bad),
        Hostile("1,500,000 stop strings", "/v1/chat/completions", json.dumps(stops).encode(), bad),
    ]


def hostile_requests(vocab: int, context: int, max_request_bytes: int, rng: random.Random) -> list[Hostile]:
    full_bias = _chat("Tell me everything.", max_tokens=64, ignore_eos=True, temperature=0,
                      logit_bias={str(i): 0.0 for i in range(vocab)})
    largest = {"prompt": "x" * (max_request_bytes - 100), "max_tokens": 1}
    over = b'{"prompt": "' + b"x" * (max_request_bytes + 10) + b'"}'
    # About 3 tokens per word of 5-6 letters, fresh words each time: no prefix-cache hit.
    words = " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(context // 4))
    longest = {"prompt": words, "max_tokens": 1}
    constrained = _chat(f"Describe a pet named {rng.choice(WORDS)}.", max_tokens=48, n=4, stream=True,
                        temperature=1.0, response_format={"type": "json_schema",
                                                          "json_schema": {"name": "pet", "schema": PET_SCHEMA}})
    # Issue 36's first: the longest prompt's prefill (a minute on 2 cores) would leave a short
    # run no time for them.
    return [*issue36_requests(), *issue58_requests(),
            *[Hostile("constrained, hung up", "/v1/chat/completions", json.dumps(constrained).encode(),
                      frozenset())] * 3,
            Hostile("bias on every token", "/v1/chat/completions", json.dumps(full_bias).encode(), frozenset({200})),
            Hostile("largest body", "/v1/completions", json.dumps(largest).encode(), frozenset({400})),
            Hostile("body over the limit", "/v1/completions", over, frozenset({413})),
            Hostile("longest prompt", "/v1/completions", json.dumps(longest).encode(), frozenset({200}))]


async def send_hostile(client: httpx.AsyncClient, url: str, hostile: Hostile, log: HostileLog) -> None:
    started = time.perf_counter()
    headers = {"content-type": "application/json"}
    try:
        if hostile.expect:
            reply = await client.post(url + hostile.path, content=hostile.body, headers=headers)
            outcome = str(reply.status_code)
        else:  # open the stream, read for a moment, hang up
            async def read_a_little() -> None:
                async with client.stream("POST", url + hostile.path, content=hostile.body, headers=headers) as r:
                    async for _ in r.aiter_raw():
                        pass
            try:
                await asyncio.wait_for(read_a_little(), HANG_UP_AFTER_S)
                outcome = "finished before the hang-up"
            except asyncio.TimeoutError:
                outcome = "hung up"
    except httpx.HTTPError as e:
        outcome = type(e).__name__
    log.note(hostile, outcome, time.perf_counter() - started)


async def measure_one(client: httpx.AsyncClient, url: str, rng: random.Random, tokens: int) -> float | None:
    """One streamed greedy reply -> its per-token latency (s), or None if it did not finish whole."""
    topic = " ".join(rng.choices(WORDS, k=8))
    body = _chat(f"Write a story about {topic}", temperature=0, max_tokens=tokens, ignore_eos=True, stream=True,
                 logprobs=True)
    arrivals: list[float] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            return None
        reader = SSEReader()
        async for line in reply.aiter_lines():
            event = reader.feed(line)
            if event is None:
                continue
            if event[1] == DONE:
                break
            chunk = json.loads(event[1])
            if "error" in chunk:
                return None
            arrivals += [time.perf_counter()] * len((chunk["choices"][0].get("logprobs") or {}).get("content") or [])
    if len(arrivals) != tokens:
        return None
    return (arrivals[-1] - arrivals[0]) / (tokens - 1)


async def measuring_client(url: str, seed: int, until: asyncio.Event, tokens: int, latencies: list[float],
                           failures: list[int]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=600) as client:
        while not until.is_set():
            latency = await measure_one(client, url, rng, tokens)
            if latency is None:
                failures.append(seed)
            else:
                latencies.append(latency)


async def hostile_client(url: str, until: asyncio.Event, log: HostileLog, requests: list[Hostile],
                         passes: int | None) -> None:
    """Cycles through `requests` until `until` (or for `passes` passes, then sets it)."""
    done = 0
    async with httpx.AsyncClient(timeout=600) as client:
        while not until.is_set():
            for hostile in requests:
                if until.is_set():
                    return
                await send_hostile(client, url, hostile, log)
            done += 1
            if passes is not None and done >= passes:
                until.set()


async def health_watch(url: str, until: asyncio.Event, worst: list[float]) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        while not until.is_set():
            started = time.perf_counter()
            await client.get(f"{url}/health")
            worst[0] = max(worst[0], time.perf_counter() - started)
            await asyncio.sleep(0.05)


async def soak(url: str, clients: int, tokens: int, facts: dict, hostile: bool, seconds: float | None = None,
               passes: int | None = None, only: list[str] | None = None) -> dict:
    """One run: for `seconds`, or (hostile) until the hostile client has made `passes` passes."""
    latencies: list[float] = []
    failures: list[int] = []
    log = HostileLog()
    worst = [0.0]
    until = asyncio.Event()
    tasks = [measuring_client(url, i, until, tokens, latencies, failures) for i in range(clients)]
    tasks.append(health_watch(url, until, worst))
    if hostile:
        # Built before the run: encoding megabytes of JSON holds this process's loop (and so the
        # quiet clients and /health's stopwatch) for a second, which the server would be blamed for.
        requests = [h for h in hostile_requests(facts["vocab"], facts["context"], facts["max_request_bytes"],
                                                random.Random(7)) if not only or h.name in only]
        tasks.append(hostile_client(url, until, log, requests, passes))

    async def timer() -> None:
        await asyncio.sleep(seconds)
        until.set()

    if seconds is not None:
        tasks.append(timer())
    await asyncio.gather(*tasks)
    return {"median_s": statistics.median(latencies) if latencies else float("nan"), "requests": len(latencies),
            "failed_replies": len(failures), "health_worst_s": worst[0], "hostile": log.statuses,
            "hostile_slowest_s": log.slowest_s, "unexpected": log.unexpected}


async def one_at_a_time(url: str, facts: dict) -> list[tuple[str, str, float, float]]:
    """Issue 36's method: each hostile request alone while /health is polled every 50 ms ->
    (name, outcome, seconds to answer, /health's worst seconds meanwhile)."""
    rows = []
    for hostile in hostile_requests(facts["vocab"], facts["context"], facts["max_request_bytes"], random.Random(7)):
        log = HostileLog()
        worst = [0.0]
        until = asyncio.Event()

        async def send() -> None:
            async with httpx.AsyncClient(timeout=600) as client:
                await send_hostile(client, url, hostile, log)
            await asyncio.sleep(0.2)  # what it left running (a hung-up request's grammars) still counts
            until.set()

        await asyncio.gather(send(), health_watch(url, until, worst))
        rows.append((hostile.name, next(iter(log.statuses[hostile.name])), log.slowest_s[hostile.name], worst[0]))
    return rows


async def burst(url: str, hostile: Hostile, copies: int = 8) -> tuple[str, str, float, float]:
    """Issue 58's burst: `copies` of one hostile request at once, /health polled meanwhile."""
    log, worst, until = HostileLog(), [0.0], asyncio.Event()

    async def send_all() -> None:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=copies)) as client:
            await asyncio.gather(*(send_hostile(client, url, hostile, log) for _ in range(copies)))
        until.set()

    await asyncio.gather(send_all(), health_watch(url, until, worst))
    return (f"{copies} x {hostile.name} at once", ",".join(log.statuses[hostile.name]), log.slowest_s[hostile.name],
            worst[0])


async def idle_sockets(url: str, count: int = 2000) -> tuple[str, str, float, float]:
    """Issue 58's: `count` connections that send nothing, then /health and a chat completion."""
    host, port = url.removeprefix("http://").split(":")
    writers = []
    try:
        for _ in range(count):
            writers.append((await asyncio.open_connection(host, int(port)))[1])
        async with httpx.AsyncClient(timeout=60) as client:
            started = time.perf_counter()
            health = await client.get(f"{url}/health")
            health_s = time.perf_counter() - started
            started = time.perf_counter()
            chat = await client.post(f"{url}/v1/chat/completions", json=_chat(max_tokens=4))
            return (f"{count} idle sockets, then a chat", f"{health.status_code},{chat.status_code}",
                    time.perf_counter() - started, health_s)
    finally:
        for writer in writers:
            writer.close()


def server_facts(url: str) -> dict:
    info = httpx.get(f"{url}/v1/server_info").json()
    tokenizer = httpx.get(f"{url}/tokenizer_info").json()
    return {"vocab": tokenizer["vocab_size"], "context": info["max_model_len"],
            "max_request_bytes": int(info["server"]["max_request_mb"] * 2**20)}


def main() -> int:
    from batchproof.commands.bench.servers import start_batchproof

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", action="append", default=None, metavar="NAME",
                        help="send only the hostile requests of this name (repeatable): which one costs what")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="only send each hostile request alone, /health polled every 50 ms (issue 36's table)")
    args = parser.parse_args()
    if args.only:
        unknown = set(args.only) - {h.name for h in hostile_requests(1, 64, 1024, random.Random(0))}
        if unknown:
            parser.error(f"no hostile request named {sorted(unknown)}")
    process, url = start_batchproof(["serve", "--max-logit-bias", "262144"])
    try:
        facts = server_facts(url)
        if args.one_at_a_time:
            rows = asyncio.run(one_at_a_time(url, facts))
            stops = next(h for h in issue58_requests() if h.name == "1,500,000 stop strings")
            rows += [asyncio.run(burst(url, stops)), asyncio.run(idle_sockets(url))]
            for name, outcome, took, worst in rows:
                print(f"{name:36s} {outcome:>28s} in {took:6.2f} s; /health at worst {worst * 1000:6.0f} ms")
            return 0
        asyncio.run(soak(url, args.clients, args.tokens, facts, False, seconds=10))  # warm-up
        runs = []
        for _ in range(args.rounds):
            for hostile in (False, True):
                result = asyncio.run(soak(url, args.clients, args.tokens, facts, hostile, seconds=args.seconds,
                                          only=args.only))
                runs.append((hostile, result))
                print(f"{'hostile' if hostile else 'quiet  '}: median {result['median_s'] * 1000:.1f} ms/token over "
                      f"{result['requests']} replies ({result['failed_replies']} failed); /health at worst "
                      f"{result['health_worst_s'] * 1000:.0f} ms", flush=True)
                for name, counts in result["hostile"].items():
                    print(f"    {name}: {counts}, slowest {result['hostile_slowest_s'][name]:.2f} s", flush=True)
                if result["unexpected"]:
                    print(f"    UNEXPECTED: {result['unexpected']}", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)
    quiet = statistics.median(r["median_s"] for h, r in runs if not h)
    loud = statistics.median(r["median_s"] for h, r in runs if h)
    print(f"hostile / quiet median per-token latency: {loud / quiet:.2f}x (target <= 1.5x)")
    unexpected = [u for _, r in runs for u in r["unexpected"]]
    return 0 if loud / quiet <= 1.5 and not unexpected else 1


if __name__ == "__main__":
    raise SystemExit(main())
