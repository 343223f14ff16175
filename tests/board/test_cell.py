"""A cell's verdict from its two runs: theirs when they agree, UNSTABLE when not; and when a
control's cell counts as caught."""

from batchproof.board.cell import cell, is_caught


def run(verdict: str, result: str = "PASS", reasons: tuple[str, ...] = (), unreachable: str | None = None) -> dict:
    return {"verdict": verdict, "probe_result": result, "reasons": list(reasons), "unreachable": unreachable}


def test_two_runs_that_agree_give_their_verdict() -> None:
    found = cell([run("ADMISSIBLE"), run("ADMISSIBLE")])
    assert (found["verdict"], found["agree"]) == ("ADMISSIBLE", True)


def test_two_runs_that_disagree_are_unstable_with_no_verdict() -> None:
    s7 = "S7: decode at c=4 is 0.7 tok/s, 10.7% of c=1's 6.7 tok/s; the contract needs at least 50%"
    assert cell([run("NOT ADMISSIBLE", reasons=(s7,)), run("ADMISSIBLE")])["verdict"] == "UNSTABLE"
    # The same verdict from different probe results is not the same measurement either.
    found = cell([run("NOT ADMISSIBLE", "FAIL", ("S6: c=4 result FAIL is not PASS",)),
                  run("NOT ADMISSIBLE", "UNMEASURABLE", ("S6: c=4 result UNMEASURABLE is not PASS",))])
    assert (found["verdict"], found["agree"]) == ("UNSTABLE", False)


def test_an_unreachable_run_makes_the_cell_unreachable() -> None:
    found = cell([run("UNREACHABLE", "UNMEASURABLE", unreachable="cannot connect to http://127.0.0.1:9")])
    assert (found["verdict"], found["why"]) == ("UNREACHABLE", "cannot connect to http://127.0.0.1:9")


def test_a_control_is_caught_only_for_batching_in_both_runs() -> None:
    drift = ("logprobs: c=4 logprobs differ from m=1 by up to 0.003 (slot 0, first at token 0); ...",)
    identity = ("S4: identity field commit missing",)
    assert is_caught({**cell([run("NOT ADMISSIBLE", reasons=drift)] * 2)})
    assert not is_caught({**cell([run("NOT ADMISSIBLE", reasons=identity)] * 2)})
    assert not is_caught({**cell([run("NOT ADMISSIBLE", reasons=drift), run("NOT ADMISSIBLE", reasons=identity)])})
    assert not is_caught({**cell([run("ADMISSIBLE")] * 2)})
    assert not is_caught({**cell([run("NOT ADMISSIBLE", reasons=drift), run("ADMISSIBLE")])})
    # Both runs fail for batching, their bands differently (one formed c=16 whole, one not): caught.
    split = cell([run("NOT ADMISSIBLE", "UNMEASURABLE", drift + ("S3: c=16 m_formed 8 != c",)),
                  run("NOT ADMISSIBLE", "PASS", drift)])
    assert split["verdict"] == "UNSTABLE" and is_caught(split)
    assert not is_caught({**cell([run("NOT ADMISSIBLE", reasons=drift)])})  # one run is not two
