"""Predicted training memory, component by component, from the model config and the run options.

Runs before anything starts (the CLI's `predict`, the run form), so it imports no torch. Every
figure is in bytes of tensors the caching allocator hands out; the CUDA context, the allocator's
cache and its rounding are not predicted (the context is measured in the kernel phase).
docs/PREDICTION.md states each formula and where it comes from.

The model is the BertForSequenceClassification that `presets.build_model` builds, trained the way
the worker trains it: the Trainer's defaults (weight decay 0, max_grad_norm 1, gradients set to
None by zero_grad), autocast for fp16/bf16 (weights stay fp32), PyTorch's SDPA attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from anatomy.analysis.components import Components, rest_of_peak
from anatomy.analysis.models import PRESETS, parameter_count
from anatomy.analysis.options import RunOptions
from anatomy.units import size_text

FP32 = 4
HALF = 2
NUM_LABELS = 2  # the worker's dummy dataset has binary labels
# PyTorch's default cuBLAS workspace on Hopper and newer is 32 MiB a handle (8 MiB before); the
# forward pass and the autograd thread each use a handle, both through the caching allocator.
CUBLAS_WORKSPACES = 2 * 32 * 2**20

# The walkthrough's bytes per parameter ("Model training anatomy", Anatomy of Model's Memory),
# shown beside what a run predicts and measures.
WALKTHROUGH_BYTES_PER_PARAMETER: dict[str, float] = {
    "weights, fp32": 4,
    "weights, mixed precision (fp32 + fp16 copy)": 6,
    "gradients (always fp32)": 4,
    "optimizer states, AdamW": 8,
    "optimizer states, 8-bit AdamW": 2,
    "optimizer states, SGD with momentum": 4,
    "mixed precision AdamW, all three (plus activations)": 18,
}

COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "temporary", "peak")


@dataclass(frozen=True)
class Prediction:
    parameters: int
    weights: int
    gradients: int
    optimizer_states: int
    activations: int  # held from the end of the forward pass to the start of the backward pass
    peak: int  # the fullest moment of a step: less than the sum of the parts
    peak_at: str  # that moment: forward pass, start / end of the backward pass, optimizer step
    device: str  # "cuda" or "cpu": which kernels the figures assume
    moments: dict[str, int]  # memory at each moment of a step that could be the peak

    @property
    def temporary(self) -> int:
        """What the peak holds beyond the components alive at it, by the arithmetic the measured
        side uses (`components.rest_of_peak`), so the two compare like with like."""
        return rest_of_peak(self.weights, self.optimizer_states, self.activations,
                            self.gradients, self.peak)

    @property
    def sum_of_parts(self) -> int:
        """The walkthrough's arithmetic: every component at once. The real peak is smaller,
        since activations are freed in the backward pass while the gradients appear."""
        return (self.weights + self.gradients + self.optimizer_states + self.activations
                + self.temporary)

    def components(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COMPONENTS}

    def as_components(self) -> Components:
        """The predicted parts in the measured side's shape, to be read the same way."""
        return Components(weights=self.weights, gradients=self.gradients,
                          optimizer_states=self.optimizer_states, activations=self.activations,
                          temporary=self.temporary)

    def bytes_per_parameter(self) -> dict[str, float]:
        """This prediction in the walkthrough's unit, for the components it gives one for."""
        per = {name: getattr(self, name) / self.parameters
               for name in ("weights", "gradients", "optimizer_states")}
        per["weights + gradients + optimizer states"] = sum(per.values())
        return per

    def need_line(self) -> str:
        """The sentence the CLI and the run form show."""
        size = size_text(self.peak)
        if self.device == "cuda":
            return (f"this run should need about {size} of GPU memory (peak: {self.peak_at}), "
                    "plus the CUDA context and the allocator's cache")
        return (f"this run should need about {size} of CPU memory for tensors (peak: "
                f"{self.peak_at}), plus the Python process itself")

    def to_dict(self) -> dict:
        return {"parameters": self.parameters, "components": self.components(),
                "sum_of_parts": self.sum_of_parts, "peak_at": self.peak_at, "moments": self.moments,
                "device": self.device}


def walkthrough_bytes_per_parameter(options: RunOptions) -> dict[str, float | None]:
    """The walkthrough's figure for this run's weights, gradients and optimizer states; None where
    it gives none (Adafactor, Adagrad, RMSprop, and the Trainer's momentum-less SGD)."""
    states = {"adamw_torch": 8.0, "adamw_torch_fused": 8.0}.get(options.optim)
    return {"weights": 4.0 if options.precision == "fp32" else 6.0, "gradients": 4.0,
            "optimizer_states": states}


@dataclass(frozen=True)
class _Bert:
    """The sizes of a BERT config that memory depends on."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int
    token_types: int

    @classmethod
    def from_config(cls, config: dict) -> _Bert:
        return cls(config["hidden_size"], config["num_hidden_layers"],
                   config["num_attention_heads"], config["intermediate_size"],
                   config["vocab_size"], config["max_position_embeddings"],
                   config["type_vocab_size"])


def parameter_shapes(config: dict, num_labels: int = NUM_LABELS) -> list[tuple[int, ...]]:
    """Shapes of BertForSequenceClassification's parameters, in the model's order.

    Adafactor's states depend on the shapes, not only on the count; the tests check these
    against the built model.
    """
    m = _Bert.from_config(config)
    h, i = m.hidden, m.intermediate
    embeddings = [(m.vocab, h), (m.positions, h), (m.token_types, h), (h,), (h,)]
    layer = [(h, h), (h,)] * 4 + [(h,), (h,), (i, h), (i,), (h, i), (h,), (h,), (h,)]
    head = [(h, h), (h,), (num_labels, h), (num_labels,)]
    return embeddings + layer * m.layers + head


def optimizer_state_bytes(optim: str, shapes: list[tuple[int, ...]]) -> int:
    """Bytes of the optimizer's state tensors (fp32, as the gradients are) with the Trainer's
    defaults. Per-parameter step counters and Adafactor's RMS scalar (4 bytes a tensor) are left
    out: a few kB."""
    parameters = sum(math.prod(s) for s in shapes)
    if optim in ("adamw_torch", "adamw_torch_fused"):
        return 2 * FP32 * parameters  # exp_avg and exp_avg_sq
    if optim in ("adagrad", "rmsprop"):
        # Adagrad's sum; RMSprop's square_avg (the Trainer passes momentum=0, centered=False,
        # so there is no momentum_buffer or grad_avg).
        return FP32 * parameters
    if optim == "sgd":
        return 0  # the Trainer's SGD has momentum 0: torch keeps no momentum_buffer
    if optim == "adafactor":
        # Factored second moment: a row and a column vector for every matrix, the full tensor
        # for vectors; no first moment (the Trainer leaves beta1=None).
        return FP32 * sum(s[0] + s[1] if len(s) == 2 else math.prod(s) for s in shapes)
    raise ValueError(f"no state model for optimizer {optim!r}")


def optimizer_step_temporary(optim: str, shapes: list[tuple[int, ...]], device: str) -> int:
    """Transient bytes inside optimizer.step().

    On CUDA torch's optimizers default to foreach kernels, which work on every tensor at once:
    AdamW and RMSprop take the square root of all second moments (one fp32 copy of the
    parameters), Adagrad that and the scaled gradients (two); the fused AdamW and plain SGD need
    none. On the CPU they loop over tensors, so only the largest tensor's temporaries are alive at
    a time. Adafactor (transformers') always loops: update and its negation, two copies of the
    largest tensor.
    """
    largest = FP32 * max(math.prod(s) for s in shapes)
    if optim in ("sgd", "adamw_torch_fused"):
        return 0
    if optim == "adafactor":
        return 2 * largest
    if device == "cuda":
        copies = 2 if optim == "adagrad" else 1
        return copies * FP32 * sum(math.prod(s) for s in shapes)
    return 2 * largest if optim == "adamw_torch" else largest


def _linear_weight_parameters(m: _Bert, num_labels: int = NUM_LABELS) -> int:
    """Weights of the Linear layers: the ones autocast casts to 16 bits (embeddings and LayerNorm
    stay fp32)."""
    per_layer = 4 * m.hidden * m.hidden + 2 * m.hidden * m.intermediate
    return m.layers * per_layer + m.hidden * m.hidden + num_labels * m.hidden


@dataclass(frozen=True)
class _Activations:
    per_layer: int  # what one encoder layer saves for its backward pass
    embeddings: int
    head: int
    layer_input: int  # what gradient checkpointing keeps of a layer: its input
    weight_copies_per_layer: int  # autocast's 16-bit copies of one layer's Linear weights
    weight_copies: int  # of every Linear weight
    backward_buffers: int  # gradient buffers alive while the last layer is back-propagated


def _activations(m: _Bert, options: RunOptions, device: str) -> _Activations:
    """Korthikanti et al. (2022), section 4.1, itemised for this BERT and these kernels.

    e: bytes of an activation element (2 under autocast). The residual stream and LayerNorm
    inputs stay fp32 under autocast (layer_norm autocasts to fp32, the residual adds promote).
    """
    s, b, h, a, i = options.seq_len, options.batch_size, m.hidden, m.heads, m.intermediate
    mixed = options.precision != "fp32"
    e = HALF if mixed else FP32
    sbh, sbi = s * b * h, s * b * i
    # CUDA's dropout keeps a bool mask (1 byte); the CPU's multiplies by a mask of the input's dtype.
    mask = 1 if device == "cuda" else e
    if device == "cuda":
        # SDPA's flash / memory-efficient kernels keep q, k, v, the output and one fp32
        # log-sum-exp a row: no s×s matrix (the dropout mask is regenerated from the RNG seed).
        attention_element = e
        attention_matrices = FP32 * a * s * b
    else:
        # The CPU runs SDPA's math path (fused CPU kernels take no dropout) in fp32 even under
        # autocast: softmax output, dropout mask and dropout output, s×s a head (the 5as²b term).
        attention_element = FP32
        attention_matrices = 3 * FP32 * a * s * s * b
    per_layer = (
        (3 if mixed else 1) * e * sbh  # Q/K/V Linear inputs: autocast casts the input per Linear
        + 3 * attention_element * sbh  # q, k, v kept by attention
        + attention_matrices
        + e * sbh  # attention output projection's input (shares SDPA's output on CUDA)
        + 2 * mask * sbh  # two hidden dropout masks
        + 2 * FP32 * sbh  # two LayerNorm inputs
        + e * sbh  # intermediate Linear's input
        + 2 * e * sbi  # GELU's input and the output Linear's input
    )
    embeddings = FP32 * sbh + (1 if device == "cuda" else FP32) * sbh  # LayerNorm input, mask
    # In fp32 the pooler's first-token slice is a view that keeps the last hidden state alive;
    # under autocast the pooler keeps a 16-bit copy of the slice instead (b·h: negligible).
    head = 0 if mixed else FP32 * sbh
    layer_weights = 4 * h * h + 2 * h * i
    return _Activations(
        per_layer=per_layer, embeddings=embeddings, head=head, layer_input=FP32 * sbh,
        weight_copies_per_layer=HALF * layer_weights if mixed else 0,
        weight_copies=HALF * _linear_weight_parameters(m) if mixed else 0,
        # The output Linear's input gradient, two residual-stream gradients and the first weight
        # gradients (pooler, output Linear). An allowance, not an itemisation: it matched the
        # H200 measurement of bert-large within a few MB, fp32 and bf16 alike.
        backward_buffers=FP32 * (sbi + 2 * sbh) + FP32 * (h * i + h * h))


def predict(options: RunOptions, config: dict | None = None, *, device: str = "cuda") -> Prediction:
    """Predicted memory of a training run with these options.

    `device` picks the kernels the figures assume: "cuda" (fused attention, foreach optimizers,
    bool dropout masks, cuBLAS workspaces) or "cpu" (SDPA's math path, per-tensor optimizer
    loops, float masks).
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    config = config if config is not None else PRESETS[options.preset].config_dict()
    m = _Bert.from_config(config)
    shapes = parameter_shapes(config)
    parameters = parameter_count(config, NUM_LABELS)

    # Weights stay fp32 under autocast (the Trainer's fp16/bf16); the 16-bit copies the walkthrough
    # counts as 2 more bytes a parameter are made in each forward pass and held by autograd until
    # the backward pass, so they are predicted with the activations.
    weights = FP32 * parameters
    gradients = FP32 * parameters  # .grad of fp32 weights is fp32, under autocast too
    states = optimizer_state_bytes(options.optim, shapes)
    embedding_gradients = FP32 * sum(math.prod(s) for s in shapes[:5])  # the last to appear

    act = _activations(m, options, device)
    last_layer = act.per_layer + act.weight_copies_per_layer
    forward_extra = 0
    if options.gradient_checkpointing:
        # Each BertLayer is checkpointed (non-reentrant): only its input is kept. The backward
        # pass recomputes one layer at a time; the forward pass holds autocast's weight copies
        # until autocast exits, and only then frees them (nothing saved them).
        activations = m.layers * act.layer_input + act.embeddings + act.head
        recomputed = last_layer
        forward_extra = act.weight_copies
    else:
        activations = m.layers * act.per_layer + act.embeddings + act.head + act.weight_copies
        recomputed = 0
    first_layer = last_layer + act.embeddings + (act.layer_input if recomputed else 0)
    step_temporary = optimizer_step_temporary(options.optim, shapes, device)
    workspace = CUBLAS_WORKSPACES if device == "cuda" else 0
    # Gradients are set to None after every optimizer step, so the first micro-batch runs
    # without them; with accumulation the later ones run with all of them.
    held_gradients = gradients if options.grad_accum > 1 else 0
    held = weights + states + workspace

    moments = {
        "forward pass": held + held_gradients + activations + forward_extra,
        "start of the backward pass": (held + held_gradients + activations + recomputed
                                       + act.backward_buffers),
        # Every gradient but the embeddings' exists; the first layer's activations are left.
        "end of the backward pass": held + gradients - embedding_gradients + first_layer
        + act.backward_buffers,
        "optimizer step": held + gradients + step_temporary,
    }
    peak_at = max(moments, key=moments.__getitem__)
    return Prediction(
        parameters=parameters, weights=weights, gradients=gradients, optimizer_states=states,
        activations=activations, peak=moments[peak_at], peak_at=peak_at,
        device=device, moments=moments)
