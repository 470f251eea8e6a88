"""What a recording of the training step is made of, from the run options: the one conversion of
`RunOptions` on the way into the prediction (`TracedRun.of`). It keeps the options a step's
memory depends on — the model, its LoRA adapters, the step's own (`StepOptions`) — and nothing
else, so that one recording, in memory.py's cache and recordings.py's, serves every run that
differs only in the rest. Imports no torch: the tracing (tracing/trainer_step.py) reads
StepOptions from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import RunOptions


@dataclass(frozen=True)
class StepOptions:
    """What shapes a step's memory, from the run options."""
    precision: str
    gradient_checkpointing: bool
    grad_accum: int
    optim: str
    batch_size: int
    seq_len: int  # 0 for a model of images: their size is in its config
    text: TextBatch | None = None  # a dataset's batch as the collator pads it; None: dummy data
    label_smoothing: float = 0.0  # the Trainer's label_smoothing_factor (0: the model's loss)
    target_len: int = 0  # a sequence-to-sequence model's target tokens (0: seq_len)
    # the attention the model is built with (vocabulary.Attention): how the step computes it
    attention: str = "sdpa"
    # the modules and parameters the step leaves untrained (models.freeze's names)
    frozen: tuple[str, ...] = ()


@dataclass(frozen=True)
class TracedRun:
    """The run as far as its recording depends on it (hashable: the caches key on it)."""
    model: str
    step: StepOptions
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    weights: str = "fp32"  # the weights' type (vocabulary.Weights)

    @classmethod
    def of(cls, options: RunOptions, text: TextBatch | None = None) -> TracedRun:
        """The run with these options (`text`: a dataset's batch, `options` sized to it)."""
        return cls(options.model, StepOptions(
            options.precision, options.gradient_checkpointing, options.grad_accum, options.optim,
            options.batch_size, options.seq_len, text, options.label_smoothing,
            options.target_len, str(options.attention), options.frozen), options.lora_rank,
            options.lora_targets,
            options.lora_dropout if options.lora else 0.0, str(options.weights))

    def at_batch(self, batch_size: int) -> TracedRun:
        return replace(self, step=replace(self.step, batch_size=batch_size))

    def step_for(self, images: bool) -> StepOptions:
        """The step as the model's task takes it: a model of images reads no sequence length."""
        return replace(self.step, seq_len=0) if images else self.step
