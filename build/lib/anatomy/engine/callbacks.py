"""Trainer callbacks, one job each, in the Trainer's own style: the worker composes them, and they
are what a user's own Trainer gets. Each reports through a `Reporter`.

- `PhaseMarks`: the training phase begins at on_train_begin and ends at on_train_end;
- `StepReports`: every optimizer step with its loss and the allocator's figures;
- `ComponentProbing`: the component probe over the first steps (engine/probe.py);
- `FaultInjection`: a test's out-of-memory error or crash at a given step.
"""

from __future__ import annotations

import os

import torch
from transformers import TrainerCallback

from anatomy.engine.probe import MEASURED_STEPS, ComponentProbe
from anatomy.engine.reporter import Reporter
from anatomy.store import Step

INJECT_ENV = "ANATOMY_INJECT"  # tests only: "oom@STEP" or "crash@STEP"


class PhaseMarks(TrainerCallback):
    """Marks the training phase: from on_train_begin to on_train_end."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def on_train_begin(self, args, state, control, **kwargs):
        self.reporter.begin("training")

    def on_train_end(self, args, state, control, **kwargs):
        self.reporter.end("training")


class StepReports(TrainerCallback):
    """Reports every step with its loss and the allocator's figures. The Trainer logs a step's
    loss just after on_step_end, so a step is sent from on_log (or, if nothing is logged, at the
    next step or the end of training)."""

    def __init__(self, reporter: Reporter, use_cuda: bool):
        self.reporter, self.use_cuda = reporter, use_cuda
        self.pending: Step | None = None

    def flush(self, loss: float | None = None) -> None:
        if self.pending is not None:
            self.reporter.step(self.pending._replace(loss=loss))
            self.pending = None

    def on_step_end(self, args, state, control, **kwargs):
        self.flush()
        allocated, reserved = ((torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
                               if self.use_cuda else (None, None))
        self.pending = Step(self.reporter.now(), state.global_step, state.max_steps, None,
                            allocated, reserved)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.flush(float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.flush()


class ComponentProbing(TrainerCallback):
    """Runs the component probe over the first MEASURED_STEPS steps and reports what it found,
    once: after those steps, or at the end of training if it is shorter."""

    def __init__(self, reporter: Reporter, probe: ComponentProbe):
        self.reporter, self.probe = reporter, probe

    def _report(self) -> None:
        if self.probe.forwards:  # measured at least one step, and not reported yet
            self.probe.close()
            self.reporter.components(self.probe.result())
            self.probe.forwards = 0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step < MEASURED_STEPS:
            self.probe.before_optimizer_step()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step < MEASURED_STEPS:
            self.probe.after_optimizer_step(optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == MEASURED_STEPS:
            self._report()

    def on_train_end(self, args, state, control, **kwargs):
        self._report()


class FaultInjection(TrainerCallback):
    """Tests only: from step N on, raise CUDA's out-of-memory error ("oom@N") or die without a
    word as a killed process would ("crash@N"), after that step has been reported."""

    def __init__(self, kind: str, step: int, steps: StepReports):
        self.kind, self.step, self.steps = kind, step, steps

    @classmethod
    def from_environment(cls, steps: StepReports) -> FaultInjection | None:
        value = os.environ.get(INJECT_ENV)
        if not value:
            return None
        kind, _, step = value.partition("@")
        return cls(kind, int(step or 1), steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < self.step:
            return
        self.steps.flush()
        if self.kind == "oom":
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 1.00 GiB (injected by {INJECT_ENV} for a "
                "test)")
        if self.kind == "crash":
            os._exit(9)
