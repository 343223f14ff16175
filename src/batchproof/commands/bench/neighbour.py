"""`batchproof bench --neighbour`: decode speed quiet and beside one busy process (issue 60's
table). One process that wants a whole core (`python -c 'while True: pass'`, the most ordinary
neighbour: a CI job, an evaluation client, a compiler) runs beside the servers for the busy
phase. Ours (`--serve` or `--url`) and the peer (`--vs`) are measured in the same rounds, c=1
and c=16, quiet then busy, repeated; the table gives each figure and busy / quiet."""

import subprocess
import sys
from dataclasses import dataclass, field

from batchproof.commands.bench import http, machine
from batchproof.commands.bench.figures import median

NEIGHBOUR = [sys.executable, "-c", "while True: pass"]
BANDS = (1, 16)


@dataclass
class NeighbourFigures:
    machine: dict
    max_tokens: int
    # target ("ours", "peer") -> phase ("quiet", "busy") -> "c=N" -> aggregate tok/s of each round
    runs: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)

    def median(self, target: str, phase: str, c: int) -> float:
        return median(self.runs[target][phase][f"c={c}"])


def measure(targets: dict[str, str], max_tokens: int, repeats: int, prompt: str) -> NeighbourFigures:
    """Rounds of (quiet, busy) phases, every target and band in each, so drift hits all alike."""
    figures = NeighbourFigures(machine=machine.describe(), max_tokens=max_tokens)
    models = {key: http.served_model(url) for key, url in targets.items()}
    for _ in range(repeats):
        for phase in ("quiet", "busy"):
            neighbour = subprocess.Popen(NEIGHBOUR) if phase == "busy" else None
            try:
                for key, url in targets.items():
                    body = http.chat_body(prompt, max_tokens, models[key])
                    for c in BANDS:
                        rate = http.band(url, body, c).aggregate_tok_s
                        figures.runs.setdefault(key, {}).setdefault(phase, {}).setdefault(f"c={c}", []).append(rate)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    return figures


def report(figures: NeighbourFigures) -> None:
    print(f"decode with one busy neighbour process ({figures.machine.get('cpu', '?')}, "
          f"{figures.max_tokens} tokens, aggregate tok/s, medians)")
    print(f"{'':12s} {'quiet':>9s} {'busy':>9s} {'busy/quiet':>11s}")
    for target in figures.runs:
        for c in BANDS:
            quiet, busy = figures.median(target, "quiet", c), figures.median(target, "busy", c)
            print(f"{target + f', c={c}':12s} {quiet:9.1f} {busy:9.1f} {busy / quiet:11.2f}")
