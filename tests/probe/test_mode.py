"""The probe's mode, chosen once from --mixed and --fleet: what each answers the run."""

from batchproof.common.band import Band
from batchproof.probe.judge.fleet import Listed
from batchproof.probe.mode import Fleet, Identical, Mixed, Mode, OneServer
from batchproof.probe.records.reply import StreamResult

PROMPTS = ("p0", "p1", "p2", "p3", "p4")


def run(replica: str | None = None, error: str | None = None) -> StreamResult:
    return StreamResult(completion_tokens=8, replica=replica, error=error)


def test_the_flags_compose_into_one_mode_that_a_witness_records() -> None:
    assert Mode.chosen(is_mixed=True, is_fleet=True) == Mode(Mixed(), Fleet())
    assert Mode.chosen(is_mixed=False, is_fleet=False) == Mode(Identical(), OneServer())
    for mode in (Mode(Identical(), OneServer()), Mode(Mixed(), OneServer()), Mode(Identical(), Fleet()),
                 Mode(Mixed(), Fleet())):
        witness = {"mode": mode.prompts.name, "fleet": {"result": "PASS"} if mode.server == Fleet() else None}
        assert Mode.of_witness(witness) == mode


def test_identical_fires_one_prompt_and_mixed_as_many_as_the_widest_band() -> None:
    assert Identical().fired(PROMPTS, [1, 4]) == ("p0",)
    assert Mixed().fired(PROMPTS, [1, 4]) == PROMPTS[:4]
    assert Mixed().fired(PROMPTS[:2], [1, 4]) == PROMPTS[:2]


def test_one_server_runs_each_prompt_alone_twice_whatever_came_back() -> None:
    server = OneServer()
    assert server.alone_cap(None) == 2 and server.listed({"fleet": {"replicas": [{"id": "a"}]}}) is None
    assert server.wants_another([run(error="HTTP 500")], None)
    assert not server.wants_another([run(), run()], None)


def test_a_fleet_runs_each_prompt_alone_until_every_replica_answered_twice() -> None:
    fleet, listed = Fleet(), [Listed("a", True, None), Listed("b", True, None)]
    assert fleet.listed({"fleet": {"replicas": [{"id": "a"}, {"id": "b"}]}}) == listed
    assert fleet.alone_cap(listed) == 16
    assert fleet.wants_another([run("a"), run("a"), run("b")], listed)
    assert not fleet.wants_another([run("a"), run("b"), run("a"), run("b")], listed)
    assert not fleet.wants_another([run("a", error="HTTP 500")], listed)  # a refused reference stays refused


def test_a_slot_is_judged_against_its_own_replicas_reply_on_a_fleet_only() -> None:
    runs = [run("a"), run("b")]
    assert OneServer().reference_for(runs, "b") is runs[0]
    assert Fleet().reference_for(runs, "b") is runs[1]
    assert Fleet().reference_for(runs, "c") is runs[0] and Fleet().reference_for(runs, None) is runs[0]


def test_alone_runs_are_grouped_and_named_by_prompt_and_on_a_fleet_by_replica() -> None:
    alone = [[run("a"), run("b"), run("a")], [run("b")]]
    one = OneServer().groups(alone)
    assert [(g.prompt, len(g.runs)) for g in one] == [(0, 3), (1, 1)]
    assert [OneServer().label(g, 2) for g in one] == ["prompt 0", "prompt 1"]
    fleet = Fleet().groups(alone)
    assert [(g.prompt, [r.replica for r in g.runs]) for g in fleet] == [(0, ["a", "a"]), (0, ["b"]), (1, ["b"])]
    assert [Fleet().label(g, 2) for g in fleet] == ["prompt 0 replica a", "prompt 0 replica b", "prompt 1 replica b"]
    assert Fleet().label(fleet[0], 1) == "replica a"
    assert Fleet().served_alone(alone) == ", served alone by a x2, b x2" and OneServer().served_alone(alone) == ""
    assert Fleet().is_nameless([[run(), run()]]) and not OneServer().is_nameless([[run(), run()]])


def test_the_band_line_names_who_served_only_on_a_fleet() -> None:
    band = Band(c=2, slots=[{"i": 0, "replica": "b"}, {"i": 1, "replica": "a"}], m_formed_by_replica={"a": 1})
    assert Fleet().served(band) == "a:1(m=1), b:1" and OneServer().served(band) is None
