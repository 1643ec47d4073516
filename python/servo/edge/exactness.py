"""Whether a recording executed every step once: the check anyone can run on a ``.servo`` file.

Every policy action in a recording carries the step it was meant for (`FrameRecord.step`: its
observation's tick plus its index in its chunk) beside its chunk's provenance, and every control
tick has a frame. The edge executes exactly when, within an episode:

* **no step runs twice**: the steps of consecutive policy actions strictly increase;
* **no step runs early**: a step never runs before its own tick;
* **no step is skipped without a reason**: inside a chunk the steps follow one another, and the
  first action of a chunk is meant for its observation's tick plus the policy actions executed
  since that tick. So a chunk skips exactly the steps the robot executed while it was computed,
  however late it came; the ticks that had no policy action (fallback, hold) skip nothing: the
  chunk starts where the actions stopped, and the robot then runs that many ticks behind its
  plan until the next chunk catches up.

A chunk whose observation's frame, or a frame after it, is missing (a recorder that fell behind
drops frames, and says so) cannot be checked for the last rule and is counted ``unverified``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from servo.recording import FrameRecord


@dataclass(frozen=True)
class Violation:
    """One action that breaks a rule: at which tick, the step it was meant for, what was due."""

    tick: int
    step: int
    #: The step the rule expected there.
    expected: int
    rule: str


@dataclass(frozen=True)
class StepReport:
    """What `check_steps` found."""

    policy_actions: int
    chunks: int
    #: Chunks whose first action could not be checked (frames missing around it).
    unverified: int
    duplicated: list[Violation] = field(default_factory=list)
    early: list[Violation] = field(default_factory=list)
    skipped: list[Violation] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """No rule broken."""
        return not (self.duplicated or self.early or self.skipped)

    def summary(self) -> str:
        """One line: counts, and the first violation of each rule."""
        first = [f"{v.rule} at tick {v.tick} (step {v.step}, expected {v.expected})" for v in self.violations()[:3]]
        return (
            f"{self.policy_actions} policy actions in {self.chunks} chunks ({self.unverified} unverified): "
            f"{len(self.duplicated)} duplicated, {len(self.early)} early, {len(self.skipped)} skipped"
            + (f"; {', '.join(first)}" if first else "")
        )

    def violations(self) -> list[Violation]:
        """Every violation, by tick."""
        return sorted([*self.duplicated, *self.early, *self.skipped], key=lambda v: v.tick)


def check_steps(frames: Sequence[FrameRecord]) -> StepReport:
    """Check the rules of the module docstring over a recording's frames (`read_recording`)."""
    ticks = [frame.tick for frame in frames]
    policy = [frame.source == "policy" and None not in (frame.step, frame.provenance) for frame in frames]
    executed = [0]  # executed[i]: policy actions among frames[:i]
    for is_policy in policy:
        executed.append(executed[-1] + is_policy)
    tick_at = {frame.mono_ns: frame.tick for frame in frames}
    duplicated: list[Violation] = []
    early: list[Violation] = []
    skipped: list[Violation] = []
    chunks = unverified = 0
    previous: FrameRecord | None = None
    for i, frame in enumerate(frames):
        step, prov = frame.step, frame.provenance
        if not policy[i] or step is None or prov is None:
            continue
        if previous is not None and previous.provenance is not None and previous.provenance[2] != prov[2]:
            previous = None  # a new episode plans from scratch
        if step > frame.tick:
            early.append(Violation(frame.tick, step, frame.tick, "early"))
        last = None if previous is None else previous.step
        if last is not None and step <= last:
            duplicated.append(Violation(frame.tick, step, last + 1, "duplicated"))
        elif previous is not None and previous.provenance == prov:
            if last is not None and step != last + 1:
                skipped.append(Violation(frame.tick, step, last + 1, "skipped inside a chunk"))
        else:
            chunks += 1
            obs_tick = tick_at.get(prov[3])
            first = None if obs_tick is None else bisect.bisect_left(ticks, obs_tick)
            if obs_tick is None or first is None or i - first != frame.tick - obs_tick:
                unverified += 1  # frames missing between the observation and this action
            elif step != obs_tick + executed[i] - executed[first]:
                due = obs_tick + executed[i] - executed[first]
                rule = "skipped" if step > due else "duplicated"
                (skipped if step > due else duplicated).append(Violation(frame.tick, step, due, rule))
        previous = frame
    return StepReport(sum(policy), chunks, unverified, duplicated, early, skipped)
