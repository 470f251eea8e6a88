"""The training side's voice: phase marks, steps and findings, as protocol messages on the run's
queue, each stamped with the run's clock and the sender's `Source`.

Imports no torch: the worker marks its baseline with it before torch is loaded.
"""

from __future__ import annotations

import time
from typing import Any

from anatomy.engine import protocol
from anatomy.store import Components, Message, PhaseMark, RunFacts, Step, TrainingSummary
from anatomy.vocabulary import Edge, Phase, Status


class Reporter:
    """Sends a run's events. `t0` is the run's start on the monotonic clock (shared by every
    process of the machine); `dwell` is how long a state between two steps is held."""

    def __init__(self, queue, t0: float, dwell: float = 0.0,
                 source: protocol.Source | None = None):
        self.queue, self.t0, self.dwell = queue, t0, dwell
        self.source = source or protocol.Source()
        self.open_phase: Phase | str | None = None  # a user's script may name its own
        self.last_mark: float | None = None  # when the last phase mark or step was sent
        self.begun: set[Phase | str] = set()  # the phases begun: what the run never reached

    def now(self) -> float:
        return time.monotonic() - self.t0

    def begin(self, name: Phase | str) -> None:
        self.last_mark = self.now()
        self.queue.put(protocol.Phase(PhaseMark(Edge.START, name, self.last_mark), self.source))
        self.open_phase = name
        self.begun.add(name)

    def end(self, name: Phase | str, at: float | None = None) -> None:
        """The phase ends now, or at `at` (the run's clock) where it ended earlier than it is
        said."""
        t = self.now() if at is None else at
        self.last_mark = t
        self.queue.put(protocol.Phase(PhaseMark(Edge.END, name, t), self.source))
        self.open_phase = None

    def hold(self, name: Phase | str) -> None:
        """A state between two steps: begun, held a few sample periods (so the sampler sees it
        even on a tiny model), ended as the next step begins."""
        self.begin(name)
        time.sleep(self.dwell)
        self.end(name)

    def step(self, step: Step) -> None:
        self.last_mark = step.t
        self.queue.put(protocol.StepReport(step, self.source))

    def tell(self, level: str, text: str) -> None:
        self.queue.put(protocol.Note(Message(self.now(), level, text), self.source))

    def predicted(self, peak: int) -> None:
        self.queue.put(protocol.Predicted(peak, self.source))

    def environment(self, facts: RunFacts) -> None:
        self.queue.put(protocol.Environment(facts, self.source))

    def described(self, options: dict[str, Any], model: str | None,
                  dropped: tuple[str, ...] = ()) -> None:
        self.queue.put(protocol.Described(options, model, self.source, dropped))

    def components(self, components: Components) -> None:
        self.queue.put(protocol.ComponentsMeasured(components, self.source))

    def operations(self, values: dict[str, Any]) -> None:
        self.queue.put(protocol.OperationsProfiled(values, self.source))

    def summary(self, summary: TrainingSummary) -> None:
        self.queue.put(protocol.Summarised(summary, self.source))

    def failure(self, status: Status, text: str, after_peer: bool = False,
                at: float | None = None) -> None:
        """The training failed now, or at `at` (the run's clock) where that was earlier than it
        is said: of several ranks, the earliest failure is the cause."""
        self.queue.put(protocol.Failure(status, text, self.source, after_peer,
                                        self.now() if at is None else at))
