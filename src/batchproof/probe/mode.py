"""The probe's mode, chosen once from --mixed and --fleet: what a band fires (identical or mixed
prompts) and what serves it (one server, or a fleet of replicas). The run asks it how many alone
runs a prompt needs, which m=1 reply a slot is judged against, how a band is judged and what the
band line says, instead of branching on the flags."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchproof.common.band import Band
from batchproof.probe.judge.fleet import (
    Listed,
    alone_cap,
    fleet_record,
    judge_fleet,
    listed_replicas,
    needs_more_alone,
    served_by,
)
from batchproof.probe.judge.fleet_band import judge_fleet_band
from batchproof.probe.judge.mixed_verdict import Reference, judge_mixed_band
from batchproof.probe.judge.references import AloneGroup, fleet_replies
from batchproof.probe.judge.verdict import BandJudgement, Policy, Sample, judge_band
from batchproof.probe.records.reply import StreamResult

Judged = tuple[BandJudgement, int | None]  # a band's judgement and its worst slot


@dataclass(frozen=True)
class OneServer:
    """One server: each prompt's two alone runs are its reference, every slot is judged against
    the first, and a band of identical requests must agree with itself."""

    alone_plan = ""  # what the m=1 phase's label adds

    def listed(self, info: Any) -> list[Listed] | None:
        return None

    def alone_cap(self, listed: list[Listed] | None) -> int:
        return 2

    def wants_another(self, runs: Sequence[StreamResult], listed: list[Listed] | None) -> bool:
        return len(runs) < 2

    def groups(self, alone: list[list[StreamResult]]) -> list[AloneGroup]:
        return [AloneGroup(p, runs) for p, runs in enumerate(alone)]

    def label(self, group: AloneGroup, num_prompts: int) -> str:
        return f"prompt {group.prompt}"

    def served_alone(self, alone: list[list[StreamResult]]) -> str:
        return ""

    def is_nameless(self, alone: list[list[StreamResult]]) -> bool:
        return False

    def reference_for(self, runs: list[StreamResult], replica: str | None) -> StreamResult:
        return runs[0]

    def judge_identical(
        self, c: int, m_formed: int, references: Sequence[Reference], slots: Sequence[Sample],
        replicas: Sequence[str | None], policy: Policy,
    ) -> Judged:
        ref = references[0]
        return judge_band(c, m_formed, ref.identities, ref.margins, slots, policy), 0

    def served(self, band: Band) -> str | None:
        return None

    def agreement(
        self, alone: list[list[StreamResult]], bands: list[Band], listed: list[Listed] | None, n_predict: int
    ) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class Fleet:
    """A fleet of replicas: each measured alone until it has answered every prompt twice, each
    slot judged against its own replica's m=1 reply, and the replicas against each other."""

    alone_plan = ", each replica twice (at most)"

    def listed(self, info: Any) -> list[Listed] | None:
        return listed_replicas(info)

    def alone_cap(self, listed: list[Listed] | None) -> int:
        return alone_cap(listed)

    def wants_another(self, runs: Sequence[StreamResult], listed: list[Listed] | None) -> bool:
        # A refused reference stays refused: more runs would not change that.
        return runs[-1].error is None and needs_more_alone([r.replica for r in runs], listed)

    def groups(self, alone: list[list[StreamResult]]) -> list[AloneGroup]:
        # Two replicas that disagree are not one unstable server: each replica's runs are judged
        # against each other, and the replicas against each other by the fleet.
        groups = []
        for p, runs in enumerate(alone):
            by_replica: dict[str | None, list[StreamResult]] = {}
            for run in runs:
                by_replica.setdefault(run.replica, []).append(run)
            groups += [AloneGroup(p, group) for group in by_replica.values()]
        return groups

    def label(self, group: AloneGroup, num_prompts: int) -> str:
        replica = f"replica {group.runs[0].replica}"
        return replica if num_prompts == 1 else f"prompt {group.prompt} {replica}"

    def served_alone(self, alone: list[list[StreamResult]]) -> str:
        counts = Counter(run.replica or "(unnamed)" for runs in alone for run in runs)
        return ", served alone by " + ", ".join(f"{replica} x{n}" for replica, n in counts.items())

    def is_nameless(self, alone: list[list[StreamResult]]) -> bool:
        """A fleet whose replies name no replica cannot be measured as one: no band is fired."""
        return all(run.replica is None for runs in alone for run in runs)

    def reference_for(self, runs: list[StreamResult], replica: str | None) -> StreamResult:
        """Its own replica's first; the prompt's first when its replica was never measured alone."""
        if replica is None:
            return runs[0]
        return next((run for run in runs if run.replica == replica), runs[0])

    def judge_identical(
        self, c: int, m_formed: int, references: Sequence[Reference], slots: Sequence[Sample],
        replicas: Sequence[str | None], policy: Policy,
    ) -> Judged:
        return judge_fleet_band(c, m_formed, references, slots, replicas, policy)

    def served(self, band: Band) -> str | None:
        return served_by(band)

    def agreement(
        self, alone: list[list[StreamResult]], bands: list[Band], listed: list[Listed] | None, n_predict: int
    ) -> dict[str, Any] | None:
        """The witness's `fleet` section: whether the replicas' m=1 replies agree bitwise."""
        slot_replicas = [s["replica"] for b in bands for s in b.slots]
        return fleet_record(judge_fleet(fleet_replies(alone, n_predict), slot_replicas, listed))


@dataclass(frozen=True)
class Identical:
    """c identical requests per band: one prompt, its slots compared with each other."""

    name = "identical"

    def fired(self, prompts: tuple[str, ...], ladder: Sequence[int]) -> tuple[str, ...]:
        return prompts[:1]

    def judge_band(
        self, server: OneServer | Fleet, c: int, m_formed: int, references: Sequence[Reference],
        slots: Sequence[Sample], replicas: Sequence[str | None], policy: Policy,
    ) -> Judged:
        return server.judge_identical(c, m_formed, references, slots, replicas, policy)


@dataclass(frozen=True)
class Mixed:
    """Slot i of a band asks prompt i (cycling), each judged against its own prompt's m=1 reply and
    never against another slot, on one server or a fleet alike."""

    name = "mixed"

    def fired(self, prompts: tuple[str, ...], ladder: Sequence[int]) -> tuple[str, ...]:
        return prompts[: max(ladder)]  # only these are referenced

    def judge_band(
        self, server: OneServer | Fleet, c: int, m_formed: int, references: Sequence[Reference],
        slots: Sequence[Sample], replicas: Sequence[str | None], policy: Policy,
    ) -> Judged:
        judgement, _, worst = judge_mixed_band(c, m_formed, references, slots, policy)
        return judgement, worst


@dataclass(frozen=True)
class Mode:
    """What a band fires and what serves it, composed: mixed prompts on a fleet are Mixed and Fleet."""

    prompts: Identical | Mixed
    server: OneServer | Fleet

    @classmethod
    def chosen(cls, is_mixed: bool, is_fleet: bool) -> "Mode":
        return cls(Mixed() if is_mixed else Identical(), Fleet() if is_fleet else OneServer())

    @classmethod
    def of_witness(cls, witness: dict[str, Any]) -> "Mode":
        """The mode a witness records: its `mode`, and a fleet section on a fleet."""
        return cls.chosen(witness.get("mode") == "mixed", witness.get("fleet") is not None)

    def judge_band(
        self, c: int, m_formed: int, references: Sequence[Reference], slots: Sequence[Sample],
        replicas: Sequence[str | None], policy: Policy,
    ) -> Judged:
        """(the band's judgement, its worst slot)."""
        return self.prompts.judge_band(self.server, c, m_formed, references, slots, replicas, policy)
