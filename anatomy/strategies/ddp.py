"""DDP: each process holds the whole model and trains on its own batches; the gradients are
averaged across the processes after each backward pass. The Trainer's own way with several
processes: it wraps the model in torch's DistributedDataParallel by itself, given nothing."""

from __future__ import annotations

from typing import Any

from anatomy.strategies.base import RankMemory, Strategy

BUCKETS = "ddp_buckets"


class Ddp(Strategy):
    name = "ddp"
    label = "DDP"
    summary = "each holds the whole model"
    communication = "DDP's gradient buckets"
    buffers = (BUCKETS,)

    def rank_memory(self, alone: Any, world: int) -> RankMemory:
        """One process's prediction plus the reducer's buckets: DistributedDataParallel as the
        Trainer leaves it (gradient_as_bucket_view=False, buckets of 25 MiB, the first 1 MiB)
        copies the trainable gradients into flat buckets of their dtype, one more copy of them,
        alive throughout a step; every rank holds all of the model states."""
        buckets = alone.gradients
        return RankMemory(alone.weights, alone.gradients, alone.optimizer_states,
                          alone.activations, {BUCKETS: buckets}, alone.peak + buckets)


STRATEGY = Ddp()
