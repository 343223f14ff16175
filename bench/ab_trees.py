"""Two source trees' engine speed, interleaved: did a change (a refactor meant to change nothing,
a new kernel) move the speed? Each round runs one fresh process per tree, alternating, each
measuring greedy decode in process (c=1: one request alone; c=4: four at once, aggregate tok/s)
on the default model, speculation off (its gains follow the machine's step costs, not the code),
and checks that both trees chose the same tokens. The medians per tree, and new/old.

    git worktree add /tmp/old <rev> && (cd /tmp/old && python setup.py build_ext --inplace -q)
    python bench/ab_trees.py --old /tmp/old --new . --rounds 5 --json bench/results/ab-....json

On a shared 2-core machine speeds drift 10-15% a minute; interleaving puts both trees under the
same drift, so the ratio is what to read."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

MEASURE = r"""
import json, time
from batchproof.engine import Engine, EngineConfig, SamplingParams  # the public face: any tree has it
engine = Engine(EngineConfig(device="cpu", speculative=False, prefix_cache=False, max_batch=4))
prompt = engine.chat_prompt_ids([{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}])
params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
engine.generate({"warm": (prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))})
rates, tokens = {}, None
for c in (1, 4):
    batch = {f"r{i}": (prompt, params) for i in range(c)}
    started = time.perf_counter()
    out = engine.generate(batch)
    elapsed = time.perf_counter() - started
    rates[c] = c * MAX_TOKENS / elapsed
    tokens = [t for o in out["r0"] for t in o.token_ids]
print(json.dumps({"rates": rates, "tokens": tokens}))
"""


def run_tree(tree: Path, max_tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    done = subprocess.run([sys.executable, "-c", MEASURE.replace("MAX_TOKENS", str(max_tokens))], env=env,
                          capture_output=True, text=True, timeout=900, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for round_ in range(args.rounds):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for name in order:
            runs[name].append(run_tree(getattr(args, name).resolve(), args.max_tokens))
            rates = runs[name][-1]["rates"]
            print(f"round {round_ + 1} {name}: " + ", ".join(f"c={c} {r:.1f} tok/s" for c, r in rates.items()))
    same_tokens = all(r["tokens"] == runs["old"][0]["tokens"] for r in runs["old"] + runs["new"])
    figures = {}
    for c in ("1", "4"):
        old = statistics.median(r["rates"][c] for r in runs["old"])
        new = statistics.median(r["rates"][c] for r in runs["new"])
        figures[f"c={c}"] = {"old_tok_s": round(old, 1), "new_tok_s": round(new, 1),
                             "new_over_old": round(new / old, 3)}
        print(f"c={c}: old {old:.1f} tok/s, new {new:.1f} tok/s, new/old {new / old:.3f}")
    print(f"same tokens in every run: {same_tokens}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "rounds": args.rounds,
                                         "max_tokens": args.max_tokens, "old": str(args.old), "new": str(args.new),
                                         "same_tokens": same_tokens, "figures": figures, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
