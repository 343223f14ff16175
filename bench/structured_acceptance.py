"""Issue 21's acceptance, on both packaged models: 50 greedy replies (50 prompts) and 50 sampled
ones (50 seeds) under the acceptance JSON schema, and 50 sampled `required` and named tool calls,
each validated with jsonschema; over HTTP against a `batchproof serve` this script starts on
loopback. `python bench/structured_acceptance.py [--model gemma3-270m]`."""

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from batchproof.engine.config import EngineConfig  # noqa: E402
from batchproof.engine.engine import Engine  # noqa: E402
from tests.helpers.live_server import live_server  # noqa: E402
from tests.server.test_structured_output import PET_FORMAT, PET_SCHEMA  # noqa: E402
from tests.server.test_tools import SCHEMAS, TIME, WEATHER  # noqa: E402

ANIMALS = ["cat", "dog", "parrot", "hamster", "rabbit", "turtle", "goldfish", "pony", "ferret", "lizard"]
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo"]


def chat(url: str, body: dict) -> dict:
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()


def run(url: str, groups: list[str] | None = None) -> dict:
    bodies = {"schema_greedy": [{"messages": [{"role": "user", "content": f"Describe a {a} called pet {i} as JSON."}],
                                 "response_format": PET_FORMAT, "max_tokens": 150, "temperature": 0}
                                for i, a in enumerate(ANIMALS * 5)],
              "schema_sampled": [{"messages": [{"role": "user", "content": "Describe a pet as JSON."}],
                                  "response_format": PET_FORMAT, "max_tokens": 150, "temperature": 1.0, "seed": s}
                                 for s in range(50)],
              "tools_required": [{"messages": [{"role": "user", "content": f"Weather and time in {CITIES[s % 5]}?"}],
                                  "tools": [WEATHER, TIME], "tool_choice": "required", "max_tokens": 150,
                                  "parallel_tool_calls": s % 2 == 0, "temperature": 1.0, "seed": s}
                                 for s in range(50)],
              "tools_named": [{"messages": [{"role": "user", "content": f"The time in {CITIES[s % 5]}?"}],
                               "tools": [WEATHER, TIME], "max_tokens": 100, "temperature": 1.0, "seed": s,
                               "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
                              for s in range(50)]}
    results = {}
    for name, group in bodies.items():
        if groups and name not in groups:
            continue
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda b: chat(url, b), group))
        valid, failures = 0, []
        for reply in replies:
            try:
                choice = reply["choices"][0]
                if name.startswith("schema"):
                    jsonschema.validate(json.loads(choice["message"]["content"]), PET_SCHEMA)
                else:  # "length" too: a cut keeps the calls it completed (parallel calls can run on)
                    assert choice["finish_reason"] in ("tool_calls", "length") and choice["message"]["tool_calls"]
                    for call in choice["message"]["tool_calls"]:
                        function = call["function"]
                        jsonschema.validate(json.loads(function["arguments"]), SCHEMAS[function["name"]])
                valid += 1
            except (KeyError, ValueError, AssertionError, jsonschema.ValidationError) as e:
                failures.append(f"{type(e).__name__}: {str(e)[:120]} in {json.dumps(reply)[:300]}")
        cut = sum(r.get("choices", [{}])[0].get("finish_reason") == "length" for r in replies)
        results[name] = {"valid": valid, "of": len(replies), "cut_by_max_tokens": cut, "failures": failures[:3]}
        print(f"{name}: {valid} of {len(replies)} valid ({cut} cut by max_tokens)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path)
    parser.add_argument("--group", action="append", help="only these groups (schema_greedy, tools_named, ...)")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, device="cpu", max_batch=16, max_model_len=1024))
    with live_server(engine) as live:
        print(json.dumps({"model": engine.model_path.name, **run(live.url, args.group)}, indent=1))


if __name__ == "__main__":
    main()
