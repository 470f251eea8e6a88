"""How the screens tell things apart: the colours of phases, runs, parts and precisions, and the
names of the measured components. One place for each, so that a phase is the same colour on
every chart of every page."""

from __future__ import annotations

from anatomy.vocabulary import Moment, Part, Phase, Precision, Unsplit

# Okabe-Ito throughout: told apart by colour-blind eyes too. Bands are drawn at BAND_OPACITY over
# a light background, so the dark curve and the labels stay readable on them.
PHASE_COLOURS = {
    Phase.BASELINE: "#56B4E9",
    Phase.KERNEL: "#CC79A7",
    Phase.WEIGHTS: "#E69F00",
    Phase.TRAINING: "#009E73",
}
BAND_OPACITY = 0.22
CURVE_COLOUR = "#1B2A41"  # the run's own curve, and "measured" beside a prediction
PREDICTED_COLOUR = "#0072B2"
FAILED_COLOUR = "#D55E00"  # what went down or did not complete
OTHER_GPU_COLOURS = ("#7F8C9A", "#A3ACB9", "#5D6D7E", "#C0C7D0")
ALLOCATED_COLOUR = "#D55E00"
RESERVED_COLOUR = "#0072B2"
CEILING_COLOUR = "#8B0000"
PROFILING_COLOUR = "#7F8C9A"
TOTAL_COLOUR = "#7F8C9A"
PAPER_COLOUR = "#E69F00"
NEUTRAL_COLOUR = "#BBBBBB"  # a phase or part without a colour of its own; connectors
# Runs told apart by colour, in an order where neighbours differ most.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
               "#F0E442")
# A run's bar by its parts (analysis/compare.py's PART_ORDER): the phases' colours where a part
# is what a phase added (the CUDA context: the kernel phase's).
PART_COLOURS = {
    Part.CONTEXT: PHASE_COLOURS[Phase.KERNEL],
    Phase.KERNEL: PHASE_COLOURS[Phase.KERNEL],  # a CPU's (CPU_PHASE_NAMES)
    Phase.WEIGHTS: PHASE_COLOURS[Phase.WEIGHTS],
    Phase.TRAINING: PHASE_COLOURS[Phase.TRAINING],
    Part.OPTIMIZER_STATES: "#0072B2",
    Part.GRADIENTS: "#D55E00",
    Part.ACTIVATIONS: "#009E73",
    Part.TEMPORARY: "#F0E442",
    Part.ALLOCATOR_CACHE: "#7F8C9A",
    Part.NON_TORCH: "#C0C7D0",
    Unsplit.BEFORE_RECORDING: "#E1E4E8",
    Phase.BASELINE: PHASE_COLOURS[Phase.BASELINE],
}
PRECISION_COLOURS = {Precision.FP32: "#0072B2", Precision.BF16: "#009E73", Precision.FP16: "#D55E00"}
# A table row whose values differ between the runs compared.
DIFFERS_BACKGROUND = "#FFF3CD"

# The moments of a step the probe reads the allocator at, in step order, as the pages name them.
MOMENT_LABELS = {
    Moment.END_OF_FORWARD: "end of the forward pass",
    Moment.END_OF_BACKWARD: "end of the backward pass",
    Moment.AFTER_OPTIMIZER_STEP: "after the optimizer step",
}

# The measured components (anatomy/analysis/components.py) as the pages name them: their own
# names in words, but for these.
COMPONENT_LABELS = {
    **{part: part.value.replace("_", " ") for part in Part},
    Part.CONTEXT: "CUDA context",
    Part.TEMPORARY: "temporary buffers",
    Part.NON_TORCH: "outside PyTorch",
}


def phase_colour(name: str) -> str:
    return PHASE_COLOURS.get(name, NEUTRAL_COLOUR)


def part_colour(part: Part | Phase | Unsplit) -> str:
    return PART_COLOURS.get(part, NEUTRAL_COLOUR)
