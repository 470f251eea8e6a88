"""What a strategy is: the `Strategy` every module of anatomy/strategies/ makes one of, and the
shapes it answers in."""

from __future__ import annotations

from typing import Any, NamedTuple


class TracedRank(NamedTuple):
    """The recording of one rank's step, as the prediction keys and traces it: rank 0 of `world`
    processes, followed by the tracer module `tracer` (prediction/tracing/)."""

    tracer: str
    world: int


class RankMemory(NamedTuple):
    """One rank's tensors, worked out from one process's prediction (bytes)."""

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: dict[str, int]  # the strategy's own, by its `buffers` names
    peak: int


class Strategy:
    """How several processes share a training. A module makes one (`STRATEGY`), registered in
    anatomy/strategies/__init__.py; its class attributes are its words, its methods its rules."""

    name: str  # the option's value and the word a run stores: "ddp"
    label: str  # as a message names it: "DDP"
    summary: str  # what it does, after its name in the option's help
    communication: str  # its buffers in a rank's row of the Anatomy page
    buffers: tuple[str, ...] = ()  # a rank prediction's names for them ("ddp_buckets")
    # The tracing module that follows one of its ranks on a fake process group; None: a rank
    # is worked out from one process's prediction (`rank_memory`).
    tracer: str | None = None

    def problems(self, world: int, gpu_count: int, here: bool) -> str | None:
        """Why it cannot train `world` processes on a machine of `gpu_count` GPUs, in one line
        that starts "strategy: "; None where it can. `here=False`: the machine is another's (an
        imported run), only what the options say alone is judged."""
        return None

    def training_arguments(self, model: Any = None) -> dict[str, Any]:
        """What the Trainer's TrainingArguments are given for it (several processes only);
        `model` as built, for what depends on its classes."""
        return {}

    def rank_memory(self, alone: Any, world: int) -> RankMemory:
        """One rank's tensors from the single-process prediction of the same per-device batch
        (`alone`: prediction's `Prediction`); a strategy with a `tracer` has its rank
        traced instead."""
        raise NotImplementedError(f"{self.label}'s rank is traced, not worked out")

    def recording_key(self, world: int) -> TracedRank | None:
        """What a rank's recording is keyed and traced by; None where one process's recording
        serves (the rank is worked out from it)."""
        return TracedRank(self.tracer, world) if self.tracer else None
