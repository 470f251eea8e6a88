"""Runs side by side, computed without Streamlit: alignment at a phase, the options that differ,
the memory each run's phases added, scaling efficiency, and the differences to a reference run.

Every figure comes from a `RunReport`; the Compare page's words and tables are
anatomy/views/compare.py, its charts anatomy/views/figures/compare.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any, NamedTuple

from anatomy.analysis import models
from anatomy.analysis.components import Components
from anatomy.analysis.options import FIELDS
from anatomy.analysis.report import RunReport
from anatomy.units import mib_text
from anatomy.vocabulary import Part, Phase, Unsplit, phase_name

# Bottom to top in a run's bar, by what each part is: what was held before the run (BASELINE,
# so that the bar's top and its peak marker read on one scale), what a recording that began
# later than the kernel phase found held (BEFORE_RECORDING), the CUDA context (on a CPU the kernel phase:
# torch loaded), the weights and training phases, the training's measured components and the
# rest beyond them (NON_TORCH). Activations and gradients share a slot (a bar has one of them).
# The pages' words for them are views/compare.py's BAR_LABELS.
PART_ORDER = (Phase.BASELINE, Unsplit.BEFORE_RECORDING, Part.CONTEXT, Phase.KERNEL, Phase.WEIGHTS,
              Phase.TRAINING, Part.OPTIMIZER_STATES, Part.ACTIVATIONS, Part.GRADIENTS, Part.TEMPORARY,
              Part.ALLOCATOR_CACHE, Part.NON_TORCH)


class BarPart(NamedTuple):
    """One part of a run's bar: what it is (a PART_ORDER member), its bytes (never negative) and
    how it was computed."""
    part: Part | Phase | Unsplit
    bytes: int
    note: str


class Difference(NamedTuple):
    absolute: float | None
    percent: float | None  # of the reference; None where it is 0 or missing


def phase_start(report: RunReport, phase: str) -> float | None:
    """When `phase` began, in seconds since the run started; None if the run never reached it."""
    reading = report.phase(phase)
    return None if reading is None else reading.start_s


GPU_OPTIONS = ("gpu", "gpus")  # what a run without a GPU has none of


def differing_options(reports: Sequence[RunReport]) -> list[str]:
    """The run options (in the form's order) whose values differ between the runs that reported
    them (`reported`): what a user's training never said, or what does not apply to a run (a
    single process's strategy, a CPU run's GPUs), is no difference."""
    def differs(name: str) -> bool:
        among = [r for r in reports if reported(r, name)]
        if name == "model":
            return any(models_differ(a, b) for a, b in combinations(among, 2))
        return len({repr(option(r, name)) for r in among}) > 1

    return [name for name in FIELDS if differs(name)]


def option(report: RunReport, name: str):
    """A run's option as a comparison shows it: as the run knows it (None for what a user's
    training did not report: never a default), and no strategy for a single process (the
    default "ddp" it stores shares nothing), no GPU index or GPUs for a run without a GPU (the
    form's defaults it stores name none), no sequence length for an image model (its images
    never read the one stored), no epochs where max steps decide (the Trainer ignores them),
    nothing a run on a dataset takes from its texts (sequence length, dataset size), its max
    length as the length its texts were cut at, its split and text column, where left to it,
    as the ones it read, and no dataset settings for one on the dummy
    data (`RunOptions.applies`)."""
    if not report.options.applies(name):
        return None
    data = report.environment.data
    if name == "max_length" and not getattr(report.ran_with, name, None) and data is not None:
        return data.max_length  # 0 stands for the limit it found: the length texts were cut at
    if name in ("split", "text_column") and not getattr(report.ran_with, name, None) and \
            data is not None and getattr(data, name):
        return getattr(data, name)  # "": the one it found (the data's only split, its text column)
    if name == "strategy" and report.world_size <= 1:
        return None
    if name == "seq_len" and report.environment.image_size:
        return None
    if name in GPU_OPTIONS and not report.on_gpu:
        return None
    if name == "epochs" and report.ran_with.max_steps:
        return None
    if name == "model":  # a user's model known by the class the callback recorded
        return report.model_name
    if not hasattr(report.ran_with, name):  # an option this anatomy does not know: as stored
        return report.stored_options.get(name)
    value = getattr(report.ran_with, name)
    # GPUs and LoRA targets as runs store them and users' runs report them: comma-separated
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else value


def reported(report: RunReport, name: str) -> bool:
    """Whether the run says anything of option `name` that applies to it: anatomy's own runs say
    every option; a user's Trainer that trained by its epochs says so by leaving max steps out."""
    if name == "max_steps":  # unset: the epochs decided, which the run said
        return report.started_by_anatomy or report.ran_with.epochs is not None
    return option(report, name) is not None


# What a model's shape is made of, as configs spell it: what two runs' configs are compared by.
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size", "n_embd", "n_layer",
              "n_head", "image_size", "patch_size")


def models_differ(a: RunReport, b: RunReport) -> bool:
    """Whether two runs trained other models, as far as they say: by their names where both have
    one; where a user's model has none (built from a config, it is known by its class alone, as
    "MistralForCausalLM" beside anatomy's run of my-mistral.json), by the shapes of their configs
    (those keys both configs write); nothing said, no difference."""
    if _named(a) and _named(b):
        return a.model_name != b.model_name
    shapes = _shape(a), _shape(b)
    if None in shapes:
        return False
    both = shapes[0].keys() & shapes[1].keys()
    return any(shapes[0][key] != shapes[1][key] for key in both)


def _named(report: RunReport) -> bool:
    """The run names its model: anatomy's own (a preset, a config, a Hub id), or a user's model
    loaded from somewhere (its `name_or_path`), not one known by its class alone."""
    facts = report.environment
    return report.started_by_anatomy or bool(report.ran_with.model) or \
        facts.model_name not in (None, facts.model_class)


def _shape(report: RunReport) -> dict[str, Any] | None:
    """The run's model config's SHAPE_KEYS: the config the callback recorded, or the one
    anatomy's run names (None where it cannot be read here: a file left on another machine)."""
    config = report.environment.model_config
    if config is None and report.started_by_anatomy:
        try:
            config = models.resolve(report.model_name).config
        except models.ModelError:
            return None
    return None if config is None else {k: config[k] for k in SHAPE_KEYS if k in config}


def memory_parts(report: RunReport) -> list[BarPart]:
    """The bar of one run: what each step of the walkthrough added, bottom to top.

    The baseline (what was held before the run: on a CPU the interpreter, on a GPU other
    processes' memory), the CUDA context (kernel − baseline), weights (weights − kernel), or for
    a recording that began at the weights phase what it held then (Unsplit.BEFORE_RECORDING),
    then the training phase's increase (training end − weights). With measured components the
    increase is split into what the peak holds (`_training_split`) and the rest (memory outside
    PyTorch's allocator, or on a CPU the process's own). Each part: `part` (what it is), `bytes`
    (never negative) and `note` (how it was computed, for the hover)."""
    memory = report.phase_memory()
    on_gpu = report.on_gpu
    parts = []
    if memory[Phase.BASELINE]:
        # The bar stands on what was held before the run, as the peak marker does (a sample of
        # the same device): without it the marker floated that far above the bar's top (on a
        # CPU the interpreter before torch, ~50 MiB), a part no bar showed.
        parts.append(BarPart(Phase.BASELINE, memory[Phase.BASELINE],
                             "held at the baseline's end, before the run loaded anything: "
                             + ("other processes' memory on this GPU" if on_gpu else
                                "the Python interpreter, before torch")))
    if memory[Phase.KERNEL] is None and memory[Phase.WEIGHTS] is not None:
        # A recording that began at the weights phase (a Trainer's callback, the model built):
        # what the process held then, in one part, so that the bar reaches the training's end.
        parts.append(BarPart(Unsplit.BEFORE_RECORDING,
                             max(0, memory[Phase.WEIGHTS] - (memory[Phase.BASELINE] or 0)),
                             "held at the weights phase's end: the process, its libraries and "
                             "the model, loaded before the recording began (not split)"))
    kernel = phase_name(Phase.KERNEL, on_gpu)
    steps = ((Phase.KERNEL, Phase.BASELINE, Part.CONTEXT if on_gpu else Phase.KERNEL,
              f"{kernel} phase − baseline"),
             (Phase.WEIGHTS, Phase.KERNEL, Phase.WEIGHTS, f"weights phase − {kernel} phase"))
    for phase, before, name, note in steps:
        if memory[phase] is not None and memory[before] is not None:
            parts.append(BarPart(name, max(0, memory[phase] - memory[before]), note))
    if memory[Phase.TRAINING] is None or memory[Phase.WEIGHTS] is None:
        return parts
    increase = memory[Phase.TRAINING] - memory[Phase.WEIGHTS]
    if increase < 0:  # an out-of-memory run: the end reading is after its memory was freed
        parts.append(BarPart(Phase.TRAINING, 0, f"training end − weights phase: {mib_text(increase)}"
                          f" (the run {report.status}; its peak is the marker)"))
        return parts
    split = _training_split(report.components) if report.components else None
    if split is None:
        parts.append(BarPart(Phase.TRAINING, increase, "training end − weights phase"))
        return parts
    rest = increase - sum(part.bytes for part in split)
    parts += [part._replace(bytes=max(0, part.bytes)) for part in split]
    parts.append(BarPart(Part.NON_TORCH, max(0, rest),
                      "training increase − the parts below it: " + (
                          "memory outside PyTorch's allocator" if on_gpu else
                          "the process's own memory beyond its tensors (Python, libraries, what"
                          " the C allocator keeps)")
                      if rest >= 0 else
                      f"the parts add up to {mib_text(-rest)} more than the increase"))
    return parts


def _training_split(c: Components) -> list[BarPart] | None:
    """The training increase as the allocator's peak holds it: the optimizer states, the larger
    of activations and gradients (the two are never all held at once), the temporary buffers
    beyond those, and the allocator's cache."""
    if c.optimizer_states is None or c.activations is None or c.gradients is None:
        return None
    larger = Part.ACTIVATIONS if c.activations >= c.gradients else Part.GRADIENTS
    smaller = Part.GRADIENTS if larger == Part.ACTIVATIONS else Part.ACTIVATIONS
    parts = [BarPart(Part.OPTIMIZER_STATES, c.optimizer_states,
                  "measured: the optimizer's state tensors after the first step"),
             BarPart(larger, c.get(larger), f"measured; larger than the {smaller} "
                  f"({mib_text(c.get(smaller))}), which are never all held at the same time")]
    if c.temporary is not None:
        parts.append(BarPart(Part.TEMPORARY, c.temporary,
                          "measured: the allocator's peak beyond the weights, states and " + larger))
    if c.allocator_cache is not None:
        parts.append(BarPart(Part.ALLOCATOR_CACHE, c.allocator_cache,
                          "measured: reserved − allocated at the allocator's peak"))
    return parts


def scaling_efficiency(rate: float | None, single_rate: float | None, processes: int
                       ) -> float | None:
    """N-process samples/s ÷ (N × 1-process samples/s): 1.0 is perfect scaling. Both rates count
    every rank's samples (the Trainer's own figure does; so does `report.steady_rate`). None
    where a figure is missing."""
    if rate is None or not single_rate or processes < 1:
        return None
    return rate / (processes * single_rate)


def _same_work(a: RunReport, b: RunReport) -> bool:
    """Two runs that differ only in how many processes share the work: the same model, per-device
    batch, sequence, precision and memory options."""
    keys = ("model", "batch_size", "seq_len", "precision", "gradient_checkpointing",
            "grad_accum", "optim", "lora_rank")
    return a.device_name == b.device_name and all(
        getattr(a.options, k) == getattr(b.options, k) for k in keys)


def scaling_efficiencies(reports: Sequence[RunReport]) -> dict[int, float | None]:
    """Each run of several processes against a single-process run of the same per-device work
    among `reports` (the latest such); runs of one process are 1.0 against themselves."""
    out: dict[int, float | None] = {}
    for r in reports:
        if r.world_size == 1:
            out[r.id] = 1.0 if _rates(r, r)[0] else None
            continue
        single = [s for s in reports if s.world_size == 1 and _same_work(s, r)]
        base = max(single, key=lambda s: s.id) if single else None
        rate, single_rate = _rates(r, base) if base else (None, None)
        out[r.id] = scaling_efficiency(rate, single_rate, r.world_size)
    return out


def _rates(run: RunReport, single: RunReport) -> tuple[float | None, float | None]:
    """The two runs' samples/s, measured alike: the steady figures (after the first steps) where
    both have them, else the Trainer's own (whole training, first steps included)."""
    a, b = run.summary, single.summary
    if a.steady_samples_per_second and b.steady_samples_per_second:
        return a.steady_samples_per_second, b.steady_samples_per_second
    return a.samples_per_second, b.samples_per_second


def difference(value: float | None, reference: float | None) -> Difference:
    """`value` − `reference`, absolute and in % of the reference (None where either is missing,
    or the reference is 0)."""
    if value is None or reference is None:
        return Difference(None, None)
    return Difference(value - reference,
                      (value - reference) / reference * 100 if reference else None)
