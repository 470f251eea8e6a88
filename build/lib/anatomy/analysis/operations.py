"""Where the time goes: PyTorch operators in the walkthrough's three classes of operation.

The classes come from Ivanov et al., "Data Movement Is All You Need" (2020), which the walkthrough
cites: tensor contractions (matrix products: linear layers, attention), statistical normalizations
(softmax, layer norm: a reduction, then a map) and element-wise operators (biases, dropout,
activations, residuals). Everything else (copies, views, allocation, embedding lookups) is
"other". `classify` puts one aten operator name in a class, from the table below and then by
pattern; `aggregate` adds up each class from torch.profiler's events (the worker profiles with
anatomy/engine/profiler.py).

Importing this module imports no torch: the dashboard reads stored profiles without it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

CONTRACTION = "tensor contraction"
NORMALIZATION = "statistical normalization"
ELEMENTWISE = "element-wise"
OTHER = "other"
CLASSES = (CONTRACTION, NORMALIZATION, ELEMENTWISE, OTHER)

_CONTRACTIONS = (
    "mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv",
    "addmv", "dot", "einsum", "_scaled_mm", "convolution", "_convolution",
    # Fused attention: softmax and dropout run inside the same kernel as the two products, so on a
    # GPU their time counts here, not as normalization or element-wise (the paper's PyTorch ran
    # them as separate operators).
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward",
)
_NORMALIZATIONS = (
    "softmax", "_softmax", "_safe_softmax", "_softmax_backward_data",
    "log_softmax", "_log_softmax", "_log_softmax_backward_data",
    "layer_norm", "native_layer_norm", "native_layer_norm_backward",
    "group_norm", "native_group_norm", "batch_norm", "native_batch_norm", "rms_norm",
    "cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss_backward",
    # Plain reductions (the Trainer's gradient clipping takes norms) are statistics too.
    "sum", "mean", "var", "std", "var_mean", "norm", "linalg_vector_norm", "_foreach_norm",
    "max", "amax", "min", "amin", "logsumexp", "all", "any",
)
_ELEMENTWISE = (
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "sqrt", "rsqrt", "exp", "log", "abs", "sign",
    "reciprocal", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "where", "masked_fill",
    "addcmul", "addcdiv", "lerp", "erf",
    "gelu", "gelu_backward", "tanh", "tanh_backward", "relu", "threshold_backward", "silu",
    "silu_backward", "sigmoid", "sigmoid_backward",
    "dropout", "native_dropout", "native_dropout_backward", "feature_dropout", "bernoulli",
    "_fused_dropout", "_masked_scale",
    "eq", "ne", "lt", "le", "gt", "ge", "isinf", "isnan", "isneginf", "logical_not",
    # The optimizer's arithmetic on every parameter at once (foreach) or in one kernel (fused).
    "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_sqrt",
    "_foreach_lerp", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_neg", "_foreach_maximum",
    "_fused_adamw", "_fused_adam", "_fused_sgd", "_fused_adagrad",
    "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale",
)
_OTHER = (
    "copy_", "to", "_to_copy", "contiguous", "clone", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "transpose", "t", "permute", "expand", "as_strided", "select", "slice",
    "squeeze", "unsqueeze", "split", "chunk", "cat", "stack", "detach", "alias", "resolve_conj",
    "resolve_neg", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "fill_", "zero_", "resize_", "arange", "normal_", "uniform_",
    "index_select", "gather", "scatter", "scatter_add_", "index_add_", "embedding",
    "embedding_backward", "embedding_dense_backward", "select_backward", "slice_backward",
    "item", "_local_scalar_dense", "lift_fresh", "scalar_tensor",
)

# The table in code: aten operator name -> class. Tested case by case.
OPERATOR_CLASSES: dict[str, str] = {
    **{f"aten::{name}": OTHER for name in _OTHER},
    **{f"aten::{name}": ELEMENTWISE for name in _ELEMENTWISE},
    **{f"aten::{name}": NORMALIZATION for name in _NORMALIZATIONS},
    **{f"aten::{name}": CONTRACTION for name in _CONTRACTIONS},
}

# For names the table lacks (new kernels, new variants), first match wins.
_PATTERNS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"attention|(^|_)(mm|bmm|matmul|linear|conv\w*)$"), CONTRACTION),
    (re.compile(r"softmax|norm(?!al)|nll_loss|cross_entropy|logsumexp"), NORMALIZATION),
    (re.compile(r"^_foreach_|^_fused_|dropout"), ELEMENTWISE),
)

# Ivanov et al.'s shares for a BERT encoder layer in PyTorch: fraction of flop and of runtime per
# class. Copied from reproductions of the paper's table (Stanford CS336's lecture notes, among
# others, which agree with one another); the paper itself was not read here. See
# docs/PREDICTION.md.
PAPER_SHARES: dict[str, dict[str, float]] = {
    CONTRACTION: {"flop": 0.9980, "runtime": 0.610},
    NORMALIZATION: {"flop": 0.0017, "runtime": 0.255},
    ELEMENTWISE: {"flop": 0.0003, "runtime": 0.135},
}
PAPER_CITATION = (
    "A. Ivanov, N. Dryden, T. Ben-Nun, S. Li, T. Hoefler: Data Movement Is All You Need: A Case "
    "Study on Optimizing Transformers. MLSys 2021, arXiv:2007.00072. Operator classes in a BERT "
    "encoder layer in PyTorch, % flop and % runtime (figures as reproduced in secondary sources)."
)

# Rough flop per element for operators the profiler does not count (it counts matrix products
# and element-wise add/mul only): softmax and layer norm make about five passes of arithmetic,
# a plain reduction (sum, norm) one or two.
_FLOP_PER_ELEMENT = {ELEMENTWISE: 1, NORMALIZATION: 5}
_REDUCTIONS = {f"aten::{name}" for name in _NORMALIZATIONS[_NORMALIZATIONS.index("sum"):]}
# Fused attention ops take q, k, v as (batch, heads, sequence, head size): two products forward,
# five backward (flash attention recomputes the scores), 2 flop per multiply-add.
# profile_steps runs gradient clipping and optimizer.step() inside this range; the classes count
# the forward and backward passes (what the paper profiled), the optimizer step is kept apart.
OPTIMIZER_RANGE = "anatomy::optimizer_step"
_FUSED_ATTENTION = re.compile(r"^aten::_scaled_dot_product_(flash|efficient|cudnn)_attention")


def classify(name: str) -> str:
    """The class of one profiler event name: the table first, then in-place and backward
    variants of a known name, then patterns; "other" when nothing matches."""
    if name in OPERATOR_CLASSES:
        return OPERATOR_CLASSES[name]
    if not name.startswith("aten::"):
        return OTHER  # autograd nodes, Python ranges, runtime calls: not operators
    base = name.removeprefix("aten::")
    for variant in (base.rstrip("_"), base.removesuffix("_backward")):
        if f"aten::{variant}" in OPERATOR_CLASSES:
            return OPERATOR_CLASSES[f"aten::{variant}"]
    for pattern, kind in _PATTERNS:
        if pattern.search(base):
            return kind
    return OTHER


@dataclass
class ClassTotals:
    time_us: float = 0.0
    flops: int = 0
    count: int = 0


@dataclass
class OperationProfile:
    device: str  # "cuda" or "cpu"
    time_source: str  # what time_us is: GPU kernel time, or CPU self time
    steps: int
    classes: dict[str, ClassTotals] = field(default_factory=dict)  # forward and backward passes
    operators: list[dict] = field(default_factory=list)  # theirs by time: name, class, totals
    optimizer: ClassTotals = field(default_factory=ClassTotals)  # clipping and optimizer.step()

    def top(self, n: int = 10) -> list[dict]:
        return self.operators[:n]

    def time_shares(self) -> dict[str, float]:
        return _shares({k: v.time_us for k, v in self.classes.items()})

    def flop_shares(self) -> dict[str, float]:
        return _shares({k: v.flops for k, v in self.classes.items()})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> OperationProfile:
        classes = {k: ClassTotals(**v) for k, v in data["classes"].items()}
        return cls(data["device"], data["time_source"], data["steps"], classes,
                   data["operators"], ClassTotals(**data["optimizer"]))


def _shares(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {k: (v / total if total else 0.0) for k, v in values.items()}


class ClassShare(NamedTuple):
    """One operation class: this run's shares of flop and time next to the paper's (None for
    "other", which the paper does not give)."""
    kind: str
    flop_share: float
    time_share: float
    paper_flop_share: float | None
    paper_time_share: float | None


def comparison(profile: OperationProfile) -> list[ClassShare]:
    """One row per class: this run's shares of flop and time next to the paper's."""
    flop, time = profile.flop_shares(), profile.time_shares()
    return [ClassShare(kind, flop.get(kind, 0.0), time.get(kind, 0.0),
                       PAPER_SHARES.get(kind, {}).get("flop"),
                       PAPER_SHARES.get(kind, {}).get("runtime")) for kind in CLASSES]


def _numel(shape) -> int:
    """Elements of a recorded input shape; a tensor list's shapes are added up."""
    if not shape:
        return 0
    if isinstance(shape[0], list):
        return sum(_numel(s) for s in shape)
    n = 1
    for size in shape:
        n *= size
    return n


def _estimated_flops(name: str, kind: str, shapes: list) -> int:
    if _FUSED_ATTENTION.match(name):
        # Forward: (q, k, v, …); backward: (grad_out, q, k, v, …). q is (b, a, s, d).
        q, k = (shapes[1], shapes[2]) if name.endswith("_backward") else (shapes[0], shapes[1])
        if len(q) != 4 or len(k) != 4:
            return 0
        products = 5 if name.endswith("_backward") else 2
        return products * 2 * _numel(q) * k[2]
    per_element = 2 if name in _REDUCTIONS else _FLOP_PER_ELEMENT.get(kind, 0)
    return per_element * max((_numel(s) for s in shapes), default=0)


def _computes_below(event) -> bool:
    """Whether an operator hands its arithmetic to another operator (aten::linear to addmm),
    looking through bookkeeping children (views, copies, conj resolution)."""
    return any(child.name.startswith("aten::")
               and (classify(child.name) != OTHER or _computes_below(child))
               for child in event.cpu_children)


def _in_optimizer_step(event) -> bool:
    while event is not None:
        if event.name == OPTIMIZER_RANGE:
            return True
        event = event.cpu_parent
    return False


def aggregate(events, device: str, steps: int) -> OperationProfile:
    """Classes' totals from torch.profiler's FunctionEvents.

    Only aten operators count. Time is self time: an operator's own CPU time, or on a GPU the
    kernels it launched itself, so nesting (aten::linear → addmm) counts nothing twice. A call is
    counted, and gets estimated flops where the profiler reports none, at the operator that does
    the work (addmm, not linear): on a GPU one that launched kernels, on the CPU one that hands
    no arithmetic to a child. Fused attention's flops are estimated at the SDPA op.
    """
    on_gpu = device == "cuda"
    classes = {kind: ClassTotals() for kind in CLASSES}
    optimizer = ClassTotals()
    by_name: dict[str, ClassTotals] = {}
    for event in events:
        if not event.name.startswith("aten::") or event.device_type.name != "CPU":
            continue  # kernels and runtime calls are read through the operator that launched them
        kind = classify(event.name)
        time_us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
        if on_gpu:
            works = time_us > 0  # it launched kernels of its own
        elif kind == OTHER:
            works = not any(child.name.startswith("aten::") for child in event.cpu_children)
        else:
            works = not _computes_below(event)
        flops = event.flops or 0
        if not flops and (works and kind != CONTRACTION or _FUSED_ATTENTION.match(event.name)):
            flops = _estimated_flops(event.name, kind, event.input_shapes or [])
        if _in_optimizer_step(event):
            into = (optimizer,)
        else:
            into = (classes[kind], by_name.setdefault(event.name, ClassTotals()))
        for totals in into:
            totals.time_us += time_us
            totals.flops += flops
            totals.count += int(works)
    ranked = sorted(by_name.items(), key=lambda item: item[1].time_us, reverse=True)
    return OperationProfile(
        device=device,
        time_source="GPU kernel time (self)" if on_gpu else "CPU self time",
        steps=steps, classes=classes,
        operators=[{"name": name, "class": classify(name), **asdict(totals)}
                   for name, totals in ranked],
        optimizer=optimizer)
