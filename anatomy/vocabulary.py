"""The names a run's things go by, as types: its status, its phases, the parts its memory is made
of, the moments of a step, its precision and backend, and who started it. (A strategy is no
name here: each is a module of anatomy/strategies/.)

Each is a `str` enum (as PyTorch's mem_tracker names memory categories and accelerate names its
distributed types): a member is its stored string (`Status.COMPLETED == "completed"`, JSON and
SQLite keep the same text as before), so stored runs read as they always did. Display words and
colours are dicts keyed by these members (views/style.py); the phases' names are here, for every
layer. Imported by every layer, importing nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Name(str, Enum):
    """A member prints, formats and compares as its value, as Python 3.11's StrEnum does (this
    anatomy runs on 3.10 too)."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class Status(Name):
    """How a run (or a sweep) stands: running, or how it ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    OOM = "oom"  # ran out of the device's memory
    STOPPED = "stopped"


class Phase(Name):
    """A stretch of a run, from the state reached to the next step's start (docs/ARCHITECTURE.md:
    Phases)."""

    BASELINE = "baseline"
    KERNEL = "kernel"
    WEIGHTS = "weights"
    TRAINING = "training"
    # Marked like a phase but outside the walkthrough's four: torch.profiler's steps after
    # training. The run's peak leaves it out (the training never held that memory).
    PROFILING = "profiling"
    PROCESS = "process"  # the one phase of a watched command that marks none of its own


# The walkthrough's four, in order.
PHASES = (Phase.BASELINE, Phase.KERNEL, Phase.WEIGHTS, Phase.TRAINING)

# The phases as every page, the CLI and an export name them (stored, they keep their members'
# values): on a GPU the walkthrough's words; without one the kernel phase loads torch and no CUDA
# kernel. One name a phase and a kind of device, here for every layer (`watch` prints them too).
PHASE_NAMES = {
    Phase.BASELINE: "baseline",
    Phase.KERNEL: "CUDA kernels",
    Phase.WEIGHTS: "weights",
    Phase.TRAINING: "training",
    Phase.PROFILING: "profiling",
    Phase.PROCESS: "process",
}
CPU_PHASE_NAMES = {**PHASE_NAMES, Phase.KERNEL: "torch loaded"}


def phase_name(phase: str, on_gpu: bool) -> str:
    """A phase as it is shown: "CUDA kernels" on a GPU, "torch loaded" on a CPU; a phase a user's
    script named itself as it named it."""
    return (PHASE_NAMES if on_gpu else CPU_PHASE_NAMES).get(phase, phase)


def phases_name(phase: str, on_gpu: Iterable[bool]) -> str:
    """A phase named for runs side by side: "CUDA kernels / torch loaded" where GPU and CPU runs
    are compared, its one name where they all ran on one kind of device."""
    kinds = sorted(set(on_gpu), reverse=True)  # the GPU's name first
    return " / ".join(dict.fromkeys(phase_name(phase, kind) for kind in kinds))


class Edge(Name):
    """Which end of a phase a mark is."""

    START = "start"  # its state is reached
    END = "end"  # the next step begins


class Level(Name):
    """How much a run's message matters: anatomy's own levels (a user's `run.note(text, level)`
    may name its own, stored and shown as given)."""

    INFO = "info"
    WARNING = "warning"


class ModelSource(Name):
    """Where a run's model was found (analysis/models.resolve)."""

    PRESET = "preset"  # shipped with anatomy
    CONFIG_FILE = "config file"
    MODEL_FOLDER = "model folder"  # as save_pretrained writes one
    HUB_CACHE = "Hub cache"


class Part(Name):
    """A component of a run's memory (analysis/components.py says how each is measured)."""

    CONTEXT = "context"  # the CUDA context: kernel phase − baseline (NVML)
    WEIGHTS = "weights"
    GRADIENTS = "gradients"
    OPTIMIZER_STATES = "optimizer_states"
    ACTIVATIONS = "activations"
    TEMPORARY = "temporary"
    ALLOCATOR_CACHE = "allocator_cache"
    NON_TORCH = "non_torch"  # NVML's peak beyond the context and the allocator's reserve
    PEAK = "peak"  # the sampled peak over the baseline


class Unsplit(Name):
    """Memory a run's bar shows in one part, for want of the phases that would split it."""

    # What a process held when its recording began after the kernel phase (a Trainer's callback
    # starts with the weights phase): the interpreter, its libraries and the model.
    BEFORE_RECORDING = "before_recording"


# The parts that are tensors: the walkthrough adds these up.
TENSOR_PARTS = (Part.WEIGHTS, Part.GRADIENTS, Part.OPTIMIZER_STATES, Part.ACTIVATIONS,
                Part.TEMPORARY)


class Moment(Name):
    """A moment of a training step at which the probe reads the allocator."""

    END_OF_FORWARD = "end of forward"
    END_OF_BACKWARD = "end of backward"
    AFTER_OPTIMIZER_STEP = "after optimizer step"


class Precision(Name):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class Weights(Name):
    """The type the weights are held in, as a model is loaded (`from_pretrained`'s dtype):
    fp32, which the Trainer's mixed precision autocasts over, or bf16 throughout."""

    FP32 = "fp32"
    BF16 = "bf16"

    @property
    def torch_name(self) -> str:
        """torch's name of the type ("float32", "bfloat16")."""
        return {"fp32": "float32", "bf16": "bfloat16"}[self.value]

    @classmethod
    def of_torch(cls, name: str | None) -> Weights | None:
        """The member whose torch name is `name` ("bfloat16": BF16); None for another type."""
        return next((member for member in cls if member.torch_name == name), None)


class Attention(Name):
    """The attention a model is built with (transformers' attn_implementation): sdpa, its own
    choice (eager for a model that has no other), or eager, which keeps the attention weights
    (batch × heads × the sequence length squared) for the backward pass."""

    SDPA = "sdpa"
    EAGER = "eager"


class Optimizer(Name):
    """The Trainer's `optim` names anatomy runs: those that need no package beyond its own."""

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    RMSPROP = "rmsprop"


class Backend(Name):
    """What measures a run's memory."""

    NVML = "nvml"  # the GPUs' memory, from the driver
    CPU_RSS = "cpu-rss"  # without a GPU: the resident memory of the training's processes


class MemoryApi(Name):
    """Which figure the backend reads."""

    V2 = "v2"  # NVML's v2 memory info: the driver's reservation apart
    V1 = "v1"
    RSS = "rss"


class SourceKind(Name):
    """Who trained a run that anatomy's own worker did not."""

    SCRIPT = "script"  # a user's script: the Trainer callback or the phase API
    WATCH = "watch"  # a command under `anatomy watch`


class RecordedBy(Name):
    """What marked a run's phases and reported its steps: how much the run can know."""

    WORKER = "worker"  # anatomy's own (`anatomy run`, the form, a sweep): every option
    CALLBACK = "callback"  # a user's Trainer with AnatomyCallback: its arguments and model
    PHASE_API = "phase api"  # a user's loop with anatomy.start(): phases and steps, no model
    COMMAND = "command"  # a command under `anatomy watch` that marked nothing: its memory alone
