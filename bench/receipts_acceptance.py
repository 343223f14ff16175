"""Receipts' acceptance run (issue 64, docs/receipts.md): replies from mixed batches through a real
server, every receipt re-executed in this process and on a second server started fresh, and
re-executing them timed against prefilling their tokens.

    python bench/receipts_acceptance.py [--per-model 64] [--models smollm2-135m gemma3-270m]
        [--model /tmp/llama-1b-q4_k_m.gguf] [--numerics float32 int8] [--concurrency 16]
        [--max-tokens 24] [--fresh-max-isa avx2] [--out bench/results/receipts-acceptance-DATE.json]

The default pairs are both packaged models (SmolLM2, Gemma 3) under both numerics (float32, int8);
--model adds a GGUF by path, e.g. the 1B file `batchproof bench --write-model PATH` writes
(bench/README.md), run under its file name. Per model and numerics: `batchproof serve --receipts
always` on a free port, --per-model requests sent --concurrency at a time (chat where the model
has a template, completions otherwise; greedy and seeded, logprobs with 0 to 3 alternatives, some
with tails, penalties and bias, some scoring their prompt: prompt_logprobs, and echo on
completions), the whole replies kept. Then (a) verify-receipt's in-process route on an engine
loaded here as the server ran (interleaved with a prefill of each reply's prompt + reply + end
token on the same engine, nothing generated or scored, the prefix cache off on both: the ratio is
the cost of re-executing over prefilling); (b) the same replies against a second server started
fresh, its instruction set capped (--fresh-max-isa: every level gives the same bits). Every
verdict must be MATCH. The results are merged into --out by model and numerics, so one may run a
pair at a time."""

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from batchproof.commands.bench import machine
from batchproof.commands.receipts.local import LocalHost
from batchproof.commands.receipts.reexecute import verify
from batchproof.commands.receipts.remote import RemoteHost
from batchproof.commands.receipts.replay import is_replayable
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.rollout_scoring import score_prompts
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.receipts.read import Item, read_items

TOPICS = ["the sea", "a fox", "robots", "a garden", "rivers", "trains", "violins", "mountains", "kites",
          "libraries", "comets", "bread", "glaciers", "harbours", "lanterns", "deserts", "owls", "maps"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: str, numerics: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "batchproof", "serve", "--port", str(port), "--model", model,
                                "--numerics", numerics, "--no-prefix-cache", *extra],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"batchproof serve --model {model} --numerics {numerics} exited {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"batchproof serve --model {model} did not become ready in 300 s")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def request(i: int, has_template: bool, max_tokens: int) -> tuple[str, dict]:
    """Request i of the mix: every other one seeded, alternatives 0 to 3, tails on one in four,
    penalties or a bias on one in five, about one in three a completion, one in six scoring its
    prompt too (prompt_logprobs; a completion's also echoed)."""
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 1000 + i} if i % 2 else {"temperature": 0.0}
    extra = [{}, {"repetition_penalty": 1.2}, {"presence_penalty": 0.5, "frequency_penalty": 0.3},
             {"logit_bias": {"30": 2.0}}, {"top_k": 40, "min_p": 0.05} if i % 2 else {}][i % 5]
    alternatives = i % 4
    text = f"Tell me about {TOPICS[i % len(TOPICS)]}."
    scores_prompt = i % 6 == 5
    if has_template and i % 3:
        body = {"messages": [{"role": "user", "content": text}], "logprobs": True, "top_logprobs": alternatives}
        path = "/v1/chat/completions"
    else:
        body = {"prompt": f"Some facts about {TOPICS[i % len(TOPICS)]}:", "logprobs": alternatives,
                **({"echo": True} if scores_prompt else {})}
        path = "/v1/completions"
    if scores_prompt:
        body["prompt_logprobs"] = (i // 6) % 3
    return path, {**body, **sampled, **extra, "max_tokens": max_tokens, "return_tail_logprobs": i % 4 == 3}


def collect(url: str, count: int, concurrency: int, max_tokens: int) -> tuple[list[dict], float]:
    """`count` replies, `concurrency` in flight at once -> the replies (whole), the wall time."""
    has_template = httpx.get(f"{url}/v1/server_info", timeout=30).json().get("chat_template") is not None

    def send(i: int) -> dict:
        path, body = request(i, has_template, max_tokens)
        response = httpx.post(f"{url}{path}", json=body, timeout=600)
        if response.status_code != 200:
            raise RuntimeError(f"request {i}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(send, range(count)))
    return replies, time.perf_counter() - started


def _counts(verdicts) -> dict:
    return dict(Counter(v.kind.name for v in verdicts))


def in_process(items: list[Item], config: EngineConfig, rounds: int) -> dict:
    """Verified on an engine here, timed against prefilling the same tokens, rounds interleaved."""
    engine = Engine(config)
    host = LocalHost(engine)
    receipts = [item.receipt for item in items]
    prefills = [([*r["prompt_token_ids"], *r["output_token_ids"], *([r["end_token_id"]] if r["end_token_id"]
                                                                   is not None else [])],
                 SamplingParams(temperature=0.0, max_tokens=0, cache_namespace=None)) for r in receipts]
    # The least any re-execution must do: the same tokens prefilled with the LM head and the
    # normaliser at every row (an echo request's work, prompt_logprobs 0), since each reply
    # position's logprob is checked against the whole vocabulary. Where the LM head outweighs
    # the body (Gemma 3 270M: 262,144 x 640) that, not a plain prefill, is re-execution's floor.
    scorings = [(ids, dataclasses.replace(params, prompt_logprobs=0)) for ids, params in prefills]
    score_prompts(engine, prefills[:16])  # warm: the first calls after a load pay its page faults
    timed: dict[str, list[float]] = {"reexecute": [], "prefill": [], "scored": []}
    verdicts = []
    def reexecute() -> None:
        nonlocal verdicts
        verdicts = verify(items, host)

    steps = [("reexecute", reexecute), ("prefill", lambda: score_prompts(engine, prefills)),
             ("scored", lambda: score_prompts(engine, scorings))]
    for n in range(rounds):  # the order alternates: what runs second in a round finds the heap warm
        for name, step in steps if n % 2 == 0 else steps[::-1]:
            started = time.perf_counter()
            step()
            timed[name].append(time.perf_counter() - started)
    reexecute_s, prefill_s, scored_s = (statistics.median(timed[name]) for name in ("reexecute", "prefill", "scored"))
    return {"verdicts": _counts(verdicts), "all_match": all(v.kind.name == "MATCH" for v in verdicts),
            "replayed": sum(map(is_replayable, receipts)), "tokens_prefilled": sum(len(ids) for ids, _ in prefills),
            "reexecute_s": round(reexecute_s, 3), "prefill_s": round(prefill_s, 3),
            "reexecute_over_prefill": round(reexecute_s / prefill_s, 3), "scored_s": round(scored_s, 3),
            "reexecute_over_scored": round(reexecute_s / scored_s, 3),
            "rounds": {name: [round(t, 3) for t in values] for name, values in timed.items()},
            "first_non_match": next((v.as_json() for v in verdicts if v.kind.name != "MATCH"), None)}


def on_fresh_server(items: list[Item], model: str, numerics: str, max_isa: str) -> dict:
    process, url = _serve(model, numerics, "--max-isa", max_isa)
    try:
        host = RemoteHost(url)
        started = time.perf_counter()
        verdicts = verify(items, host)
        host.close()
    finally:
        _stop(process)
    return {"max_isa": max_isa, "verdicts": _counts(verdicts),
            "all_match": all(v.kind.name == "MATCH" for v in verdicts),
            "verify_s": round(time.perf_counter() - started, 3),
            "first_non_match": next((v.as_json() for v in verdicts if v.kind.name != "MATCH"), None)}


def run_pair(model: str, numerics: str, args: argparse.Namespace, folder: Path) -> dict:
    process, url = _serve(model, numerics, "--receipts", "always")
    try:
        replies, wall_s = collect(url, args.per_model, args.concurrency, args.max_tokens)
        info = httpx.get(f"{url}/v1/server_info", timeout=30).json()
    finally:
        _stop(process)
    path = folder / f"replies-{label(model)}-{numerics}.jsonl"
    path.write_text("".join(json.dumps(reply) + "\n" for reply in replies))
    items = read_items(path)
    seeded = sum(item.receipt is not None and item.receipt["params"]["seed"] is not None for item in items)
    config = EngineConfig(model_path=model, device="cpu", numerics=numerics, prefix_cache=False)
    return {"model": model, "numerics": numerics, "num_prompts_scored": sum(
                item.receipt is not None and item.receipt["prompt_logprobs_sha256"] is not None for item in items),
            "numerics_id": info.get("numerics_id"),
            "decode_path": info.get("decode_path"), "num_receipts": len(items), "num_seeded": seeded,
            "concurrency": args.concurrency, "max_tokens": args.max_tokens, "collect_s": round(wall_s, 3),
            "in_process": in_process(items, config, args.rounds),
            "fresh_server": on_fresh_server(items, model, numerics, args.fresh_max_isa)}


def label(model: str) -> str:
    """A packaged model's name, or a GGUF path's file name (a results key and a file name)."""
    return Path(model).stem if model.endswith(".gguf") else model


def _run_from_snapshot() -> None:
    """Start again from a copy of the package, built kernels included: numerics_id hashes the
    engine's source, so a checkout edited during the run would give the three processes (the
    server, this one, the fresh server) three ids, and every verdict would be NUMERICS."""
    import batchproof

    snapshot = Path(tempfile.mkdtemp(prefix="receipts-acceptance-"))
    shutil.copytree(Path(batchproof.__file__).parent, snapshot / "batchproof",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(snapshot), os.environ.get("PYTHONPATH")]))}
    os.execve(sys.executable, [sys.executable, *sys.argv, "--no-snapshot"], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-model", type=int, default=64, help="receipts per model and numerics (1000: the issue's)")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"],
                        help="packaged model names (or GGUF paths)")
    parser.add_argument("--model", action="append", default=[], metavar="PATH",
                        help="a GGUF to run as well, e.g. the 1B file `batchproof bench --write-model PATH` writes "
                             "(repeatable)")
    parser.add_argument("--numerics", nargs="+", default=["float32", "int8"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2,
                        help="in-process verify/prefill rounds, interleaved, the order alternating (the medians)")
    parser.add_argument("--fresh-max-isa", default="avx2", choices=["auto", "avx512", "avx2", "portable"])
    parser.add_argument("--out", type=Path,
                        default=Path(f"bench/results/receipts-acceptance-{datetime.date.today().isoformat()}.json"))
    parser.add_argument("--no-snapshot", action="store_true",
                        help="run from the checkout as it is (by default a copy of src/batchproof is taken first)")
    args = parser.parse_args()
    if not args.no_snapshot:
        _run_from_snapshot()
    folder = args.out.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    for model in [*args.models, *(str(Path(path).resolve()) for path in args.model)]:
        for numerics in args.numerics:
            run = run_pair(model, numerics, args, folder)
            run.update(cpu=machine.describe()["cpu"], load_average=[round(x, 2) for x in os.getloadavg()],
                       date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
            result["runs"][f"{label(model)}/{numerics}"] = run
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(run, indent=2), flush=True)
    runs = result["runs"].values()
    result["all_match"] = all(r["in_process"]["all_match"] and r["fresh_server"]["all_match"] for r in runs)
    result["num_receipts"] = sum(r["num_receipts"] for r in runs)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if result["all_match"] else 1)


if __name__ == "__main__":
    main()
