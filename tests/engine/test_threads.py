"""The step's thread count follows the cores other processes leave free (engine/model/ops/threads.py), and
no count changes a bit: the same requests decoded with the count moving every step (1, 2, 1,
...) give the tokens and logprob bits of a fixed count, alone and in a batch."""

import os
import subprocess
import sys

import pytest
import torch

from batchproof.engine.model.ops import threads
from batchproof.engine.model.ops.threads import ThreadShare
from batchproof.engine.sampling.params import SamplingParams


class Machine:
    """/proc as a script: each read advances the clock by `period` and the CPUs by what is given."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = 0.0
        self.own = 0.0

    def run(self, seconds: float, others_cores: float, own_cores: float) -> None:
        self.now += seconds
        self.busy += seconds * (others_cores + own_cores)
        self.own += seconds * own_cores

    def read(self) -> tuple[float, float]:
        return self.busy, self.own


def _share(machine: Machine, max_threads: int = 2, num_cpus: int = 2) -> ThreadShare:
    return ThreadShare(max_threads, num_cpus=num_cpus, read=machine.read, clock=lambda: machine.now)


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back() -> None:
    machine = Machine()
    share = _share(machine)
    assert share.now() == 2
    machine.run(0.5, others_cores=0.05, own_cores=2.0)  # quiet: our two threads
    assert share.now() == 2
    machine.run(0.5, others_cores=0.7, own_cores=1.3)  # `while True: pass` beside two of ours
    assert share.now() == 1
    machine.run(0.5, others_cores=1.0, own_cores=1.0)  # it keeps its core: so do we keep one
    assert share.now() == 1
    machine.run(0.5, others_cores=0.0, own_cores=1.0)  # it left
    assert share.now() == 2


def test_a_light_neighbour_takes_nothing_and_the_count_is_sampled_not_read_every_step() -> None:
    machine = Machine()
    share = _share(machine)
    machine.run(0.5, others_cores=0.3, own_cores=1.7)  # the probe client, a shell
    assert share.now() == 2
    machine.run(threads.PERIOD_S / 10, others_cores=2.0, own_cores=0.0)  # too soon to sample again
    assert share.now() == 2


def test_after_an_idle_stretch_the_count_starts_again_from_the_most() -> None:
    machine = Machine()
    share = _share(machine)
    machine.run(0.5, others_cores=1.0, own_cores=1.0)
    assert share.now() == 1
    machine.run(5.0, others_cores=0.0, own_cores=0.0)  # idle: the neighbour left meanwhile (or not)
    assert share.now() == 2
    machine.run(0.3, others_cores=0.9, own_cores=1.1)  # it had not: one sampling period to find out
    assert share.now() == 1


def test_at_most_the_configured_threads_and_at_least_one() -> None:
    machine = Machine()
    share = _share(machine, max_threads=3, num_cpus=8)
    machine.run(0.5, others_cores=0.0, own_cores=3.0)
    assert share.now() == 3
    machine.run(0.5, others_cores=8.0, own_cores=0.0)
    assert share.now() == 1


def test_without_proc_the_count_stays() -> None:
    def missing() -> tuple[float, float]:
        raise OSError("no /proc")

    share = ThreadShare(2, num_cpus=2, read=missing)
    assert share.now() == 2
    assert ThreadShare(2, num_cpus=2, read=None).now() == 2


def test_this_machine_reads() -> None:
    busy, own = threads.read_machine()
    assert busy > 0 and own > 0


def _decode(engine, prompts: list[list[int]], counts: list[int] | None,
            max_tokens: int = 12) -> list[tuple[list[int], list[int]]]:
    """Greedy replies with top-5 logprobs; with `counts`, the thread count of each step in turn."""
    saved = engine.threads
    step = 0

    class Scripted:
        def now(self) -> int:
            nonlocal step
            step += 1
            return counts[step % len(counts)]

    if counts is not None:
        engine.threads = Scripted()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, top_logprobs=5, cache_namespace=None)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"threads-{counts}-{i}", prompt, params)
        outs: dict[str, list] = {}
        while engine.has_work():
            for out in engine.step():
                outs.setdefault(out.request_id, []).append(out)
    finally:
        engine.threads = saved
        engine.share_cores()
    result = []
    for i in range(len(prompts)):
        deltas = outs[f"threads-{counts}-{i}"]
        ids = [t for o in deltas for t in o.token_ids]
        logprob_bits = [torch.tensor([r.logprob], dtype=torch.float32).view(torch.int32).item()
                        for o in deltas for r in o.records]
        result.append((ids, logprob_bits))
    return result


@pytest.mark.parametrize("batch", [1, 4])
def test_a_thread_count_that_moves_every_step_changes_no_bit(engine, batch: int) -> None:
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": f"Count to {n + 3}."}]) for n in range(batch)]
    fixed = _decode(engine, prompts, [engine.num_threads])
    assert _decode(engine, prompts, [1, 2]) == fixed
    assert _decode(engine, prompts, [2, 1, 1]) == fixed


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the neighbour to one core (Linux)")
def test_a_thread_held_up_by_a_busy_neighbour_changes_no_bit(engine) -> None:
    """Two decode threads on a machine where a neighbour process wants a core: three runnable
    threads on two cores, so at joins one of ours waits whole time slices for the other (issue
    60's stalled thread, for real rather than scripted). Each output's sum belongs to one thread
    whatever the timing, so the bits are the quiet run's."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one decode thread to hold up, one to wait for it")
    # Few tokens: held up, each join waits a scheduler slice, a second or more per token.
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": f"Name {n + 2} colours."}]) for n in range(2)]
    quiet = _decode(engine, prompts, [2], max_tokens=4)
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(neighbour.pid, {cpus[-1]})  # one core taken, as a neighbour takes it
        held_up = _decode(engine, prompts, [2], max_tokens=4)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert held_up == quiet
