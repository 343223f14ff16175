"""The prefix-cache bench's rounds against two scripted servers standing in for `batchproof
serve` with the cache and without (no model, lm-eval left out): what it sends, and that it
stops what it started."""

from batchproof.commands.bench import prefix_cache
from tests.helpers.scripted_server import Script, ScriptedServer


class Process:
    pid = 0
    is_terminated = False

    def terminate(self) -> None:
        self.is_terminated = True

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_rounds(monkeypatch):
    processes = [Process(), Process()]
    with ScriptedServer(Script()) as cache, ScriptedServer(Script()) as no_cache:
        handed = iter(zip(processes, (cache.url, no_cache.url)))
        flags = []

        def start_serve(model, serve_args):
            flags.append(serve_args)
            return next(handed)

        monkeypatch.setattr(prefix_cache.servers, "start_serve", start_serve)
        monkeypatch.setattr(prefix_cache, "_lm_eval", lambda urls: "left out")
        figures = prefix_cache.measure(None, ["--num-threads", "1"], max_tokens=4, repeats=2)
    assert flags == [["--num-threads", "1"], ["--num-threads", "1", "--no-prefix-cache"]]
    assert all(p.is_terminated for p in processes)
    assert len(figures.ttft_runs.cold) == len(figures.ttft_runs.cached) == 2
    assert {name: len(runs) for name, runs in figures.c16_runs.items()} == {"cache": 2, "no_cache": 2}
    assert figures.c16_distinct_tok_s["cache"] > 0 and figures.lm_eval == "left out"
    assert {name: len(runs) for name, runs in figures.shared_runs.items()} == {"cache": 2, "no_cache": 2}
    assert figures.shared_c16_wall_s["cache"] > 0 and figures.shared_c16_cached_tokens == {"cache": 0, "no_cache": 0}
    # Per round, the cache server gets a TTFT pair (one system prompt, two questions), 16
    # prompts sharing nothing, and 16 sharing a system prompt one request put in the cache
    # first; the other server the last two.
    def system(body: dict) -> str:
        return body["messages"][0]["content"]

    ttft = [b for b in cache.state.requests if b["max_tokens"] == 1 and b["messages"][1]["content"] != "Hello."]
    systems = [system(b) for b in ttft]
    assert len(ttft) == 4 and systems[0] == systems[1] != systems[2] == systems[3]
    assert len(cache.state.requests) == 2 * (2 + 16 + 1 + 16) and len(no_cache.state.requests) == 2 * (16 + 1 + 16)
    for server in (cache, no_cache):  # each round: "Hello." alone, then 16 with its system prompt
        warm = [b for b in server.state.requests if b["messages"][1]["content"] == "Hello."]
        assert len(warm) == 2 and system(warm[0]) != system(warm[1])
        for w in warm:
            assert sum(system(b) == system(w) for b in server.state.requests) == 17
    assert len({system(b) for b in no_cache.state.requests}) == 2 * (16 + 1)
