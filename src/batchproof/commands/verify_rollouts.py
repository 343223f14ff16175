"""`batchproof verify-rollouts FILE --out DIR`: another engine's rollouts (JSONL, one a line)
re-scored by ours, batched, and the gap written as DIR/report.json and DIR/report.html
(docs/notary.md). A bad line is named on stderr and in the report, and the rest go on; a file with
nothing left to score exits 1."""

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from batchproof.common.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="rollouts as JSONL: prompt_token_ids, completion_token_ids, "
                                                "logprobs, optionally top_logprobs, id and "
                                                "routed_experts (an MoE rollout's routing)")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.json and report.html")
    parser.add_argument("--model", type=Path, help="GGUF file, checkpoint directory or packaged model name "
                                                   "(default: smollm2-135m): the weights the rollouts came from")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--near-tie", type=float, default=0.05, help="top-2 logprobs within this many nats are a "
                                                                     "near tie [default: 0.05]")
    parser.add_argument("--tis-cap", type=float, action="append", help="a truncated-IS cap to report (repeat); "
                                                                       "default: 2 and 3")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--replay-routing", action="store_true",
                        help="score a rollout that claims its MoE routing (routed_experts) under it, not under ours")
    parser.add_argument("--mask-band", type=float, nargs=2, metavar=("LOW", "HIGH"), default=(0.5, 2.0),
                        help="masked-IS band: ratios outside are dropped [default: 0.5 2]")


def read_rollouts(path: Path, vocab_size: int) -> tuple[list, list[dict]]:
    """The file's rollouts, and its bad lines ({where, field, error}); blank lines are skipped."""
    from batchproof.notary.records import RecordError, parse_line

    rollouts, bad = [], []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                rollouts.append(parse_line(text, f"line {number}", vocab_size))
            except RecordError as e:
                bad.append({"where": e.where, "field": e.field, "error": str(e)})
    return rollouts, bad


def verify(engine, rollouts: list, bad: list[dict], settings, progress: bool = True) -> dict:
    """Score `rollouts` on `engine` and build the report (rollouts the engine refuses join `bad`)."""
    from batchproof.engine.rollout_scoring import score_rollouts
    from batchproof.notary.metrics import Scored, report
    from batchproof.server.info import numerics_id

    items = [(r.prompt_token_ids, r.completion_token_ids) for r in rollouts]
    import numpy as np

    routed = frozenset(i for i, r in enumerate(rollouts) if r.routed_experts is not None)  # ours compared too
    replayed = {i: np.array(rollouts[i].routed_experts, dtype=np.int64) for i in routed} if settings.replay_routing \
        else None
    with _progress(len(items), sum(len(p) + len(c) for p, c in items), progress) as advance:
        results = score_rollouts(engine, items, advance, routed=routed, replayed=replayed)
    kept, scores = [], []
    for rollout, result in zip(rollouts, results):
        if isinstance(result, str):
            field = "routed_experts" if "routed" in result or "forced_routes" in result else "prompt_token_ids"
            bad.append({"where": rollout.where, "field": field, "error": f"{rollout.where}: {result}"})
        else:
            kept.append(rollout)
            scores.append(Scored(result.logprobs, result.top, result.routes))
    info = engine.info()
    engine_info = {"model": Path(info["model_path"]).name, "model_sha256": info["model_sha256"],
                   "numerics_id": numerics_id(info), "dtype": info["dtype"], "device": info["device"],
                   "weight_version": engine.weight_version}
    return report(kept, scores, settings, bad, engine_info)


@contextlib.contextmanager
def _progress(total: int, num_tokens: int, shown: bool) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, rollouts done and their rate; or nothing."""
    if not shown:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(f"scoring {num_tokens} tokens"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("rollouts {task.fields[rate]}"), TimeElapsedColumn(), console=Console(stderr=True))
    task = bar.add_task("score", total=total, rate="")

    def advance(n: int) -> None:
        bar.advance(task, n)
        elapsed = bar.tasks[0].elapsed or 0.0
        if elapsed > 0:
            bar.update(task, rate=f"({bar.tasks[0].completed / elapsed:.1f}/s)")

    with bar:
        yield advance


def run(args: argparse.Namespace, engine=None) -> int:
    """`engine`: one already loaded (tests), else loaded from --model and --device."""
    from batchproof.common.wire import dumps
    from batchproof.notary.page import render
    from batchproof.notary.settings import Settings

    try:
        settings = Settings(args.near_tie, tuple(args.tis_cap or (2.0, 3.0)), tuple(args.mask_band),
                            getattr(args, "replay_routing", False))
    except ValueError as e:
        print(f"batchproof verify-rollouts: {e}", file=sys.stderr)
        return 2
    if not args.file.is_file():
        print(f"batchproof verify-rollouts: no file {args.file}", file=sys.stderr)
        return 2
    if engine is None:
        engine = _load(args)
        if engine is None:
            return 2
    rollouts, bad = read_rollouts(args.file, engine.tokenizer.vocab_size)
    for line in bad:
        print(f"batchproof verify-rollouts: skipped {line['error']}", file=sys.stderr)
    report = verify(engine, rollouts, bad, settings, progress=not args.quiet)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(dumps(report) + "\n", encoding="utf-8")
    (args.out / "report.html").write_text(render(report, f"Rollout notary: {args.file.name}"), encoding="utf-8")
    summary = report["summary"]
    verdict = "all exact" if summary["all_exact"] else (f"max |delta| {summary['max_abs_diff']:.3g}, "
                                                        f"mean {summary['mean_abs_diff']:.3g}")
    print(f"{summary['num_rollouts']} rollouts, {summary['num_tokens']} tokens: {verdict}; "
          f"{summary['num_bad_records']} bad; report in {args.out}")
    # Nothing verified (every line bad, or none): an error, as the same records are a 400 over HTTP.
    return 0 if summary["num_rollouts"] else 1


def _load(args: argparse.Namespace):
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    from batchproof.engine.model.errors import load_error_message

    try:
        return Engine(EngineConfig(model_path=args.model, device=args.device))
    except ConfigError as e:
        print(f"batchproof verify-rollouts: {e}", file=sys.stderr)
    except Exception as e:
        message = load_error_message(e)
        if message is None:
            raise
        print(f"batchproof verify-rollouts: {message}", file=sys.stderr)
    return None
