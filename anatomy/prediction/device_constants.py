"""What the prediction must know about a GPU that no CPU can tell: constants measured on that GPU
by `bench/prediction_grid.py --calibrate` on a named calibration set (never on the grid the
prediction is judged on), one JSON file per device model in prediction/calibration/.

- `workspace_forward_bytes`, `workspace_backward_bytes`: cuBLAS's workspace, allocated through
  the caching allocator by the first matrix product of the forward pass (main thread) and of the
  backward pass (autograd's thread); kept for the life of the process;
- `sdpa_backends`: which scaled-dot-product-attention kernel torch picks on this GPU, by
  attention signature (dtype, head size, causal, mask, dropout, grouped-query, gradients),
  queried from torch itself (`torch._fused_sdp_choice`) on the GPU;
- `attention_backward_bytes_per_element`: scratch a backward attention kernel allocates beside
  its outputs, per element of the query (measured: the allocator's peak inside the kernel), by
  kernel ("cudnn"), and for grouped-query attention where it differs ("cudnn gqa");
- `context_bytes`: the CUDA context, as NVML sees it (the kernel phase over the baseline);
- `outside_bytes`: what NVML counts beyond the context and the caching allocator's reserve at
  the peak (kernels loaded lazily while training, library handles);
- `total_bytes`: the device's memory as NVML counts it;
- `multiprocessors`, `threads_per_multiprocessor`: CUDA's device properties
  (`multi_processor_count`, `max_threads_per_multi_processor`), by which CUDA's reduction
  kernel splits a long reduction across thread blocks and sizes its staging buffer
  (tracing/reductions.py); DEFAULT's where a calibration did not record them;
- `usable_bytes`: what CUDA lets a process allocate (`cudaMemGetInfo`'s total): NVML's total
  less the memory the driver keeps for itself (615 MiB on an H200);
- `edge_margin`: near its capacity the caching allocator cannot use all of its free memory
  (free blocks inside segments that live blocks keep reserved). The prediction replays the run
  through the simulated allocator (prediction/allocator.py) with the device's capacity: a run
  *may* fit when it does not run out of memory there, and *fits* when it does not run out with
  `edge_margin` (a fraction of the capacity) less. Fitted on runs at the capacity's edge
  (`edge_fitting_set`): the smallest margin that no run that ran out of memory passes.
- `convolution_margin`: the same for the cuDNN workspaces of a run's convolutions, which the
  trace does not know (tracing/cuda.py): the largest batch size sure to fit keeps this fraction
  of the capacity free, times the share of the forward passes' results the convolutions make
  (a ViT's one patch embedding: ~0; a convolution network's: most). Fitted on runs with
  convolutions at the capacity's edge (`convolution_fitting_set`).
- `workspace_band`: the most cuDNN's convolution workspaces, not traced, added to the allocator's
  reserve of a run on this device, as a fraction of the convolutions' share of its allocated
  peak: NVML's figure is given as a band from the traced figure up to that much more (where the
  workspaces are not measured on the GPU itself). Fitted by bench/workspace_band.py on the
  workspaces this device measured for whole networks, each traced with and without them
  (`workspace_band_fitting_set`).

Without a file for a device, `DEFAULT` holds the H200 figures of docs/MEASUREMENTS.md (measured
before calibration existed) and says so wherever it is used. Imports no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CALIBRATION_DIR = Path(__file__).parent / "calibration"
MIB = 2**20
BACKENDS = ("flash", "efficient", "cudnn", "math")


# What an attention call's mask is to the kernel choice: none; one cuDNN takes; one that needs its
# own gradient (a learnable bias: T5's, Swin's, BEiT's relative positions), which neither cuDNN nor
# flash can differentiate; one of a shape cuDNN does not take (torch's sdp_utils:
# check_attn_mask_shape, check_for_attn_mask); one whose last dimension is not contiguous, which no
# fused kernel takes on a GPU (sdp_utils_cpp.h, check_last_dim_stride_equals_1_dense: "GPU
# backends require attn_mask's last dimension to have stride 1"): T5's relative position bias as
# transformers 5.17 hands it over, a permuted view of its embedding (heads innermost).
MASKS = ("nomask", "mask", "gradmask", "oddmask", "strided")


def sdpa_signature(dtype: str, head_dim: int, is_causal: bool, mask: bool | str, dropout: bool,
                   gqa: bool, grad: bool, value_dim: int | None = None) -> str:
    """The attention call as the kernel choice depends on it, e.g. "bfloat16 d64 causal nomask
    nodrop gqa grad"; `mask` one of MASKS (True: "mask", False: "nomask"); a value head size
    other than the query's follows it ("d24v16": multi-head latent attention's)."""
    kind = mask if isinstance(mask, str) else ("mask" if mask else "nomask")
    dims = f"d{head_dim}" + (f"v{value_dim}" if value_dim not in (None, head_dim) else "")
    return " ".join((dtype, dims, "causal" if is_causal else "full", kind,
                     "dropout" if dropout else "nodrop", "gqa" if gqa else "mha",
                     "grad" if grad else "nograd"))


def mask_kind(mask, query, key) -> str:
    """`MASKS`' word for an attention mask (a tensor, or None) given the query and key it masks:
    its last dimension's stride, which every fused kernel checks first on a GPU, then torch's
    check_attn_mask_shape, which cuDNN's kernel requires."""
    if mask is None:
        return "nomask"
    if mask.stride(-1) != 1:
        return "strided"
    if mask.requires_grad:
        return "gradmask"
    shape = tuple(mask.shape)
    fits = (len(shape) in (2, 4) and shape[-2] in (query.shape[-2], 1)
            and shape[-1] in (key.shape[-2], 1)
            and (len(shape) == 2 or (shape[0] in (1, query.shape[0])
                                     and shape[1] in (1, query.shape[1]))))
    return "mask" if fits else "oddmask"


def fallback_backend(signature: str, prefer_cudnn: bool = False) -> str:
    """torch's choice on a Hopper GPU for a signature the calibration did not query, by the
    constraints of torch's sdp_utils (cuda/sdp_utils.cpp), in its order of preference (cuDNN
    first where the device's own choices show it preferred):

    - cuDNN: 16-bit; no mask, or one it takes (not a bias that needs its gradient); head sizes
      multiples of 8, and for the backward pass at most 128 (or 192/128, 256/256);
    - flash: 16-bit; no mask; one head size, at most 256;
    - memory-efficient: head sizes aligned (8 elements in 16 bits, 4 in fp32), no grouped-query
      attention (torch 2.11's, as measured);
    - the math kernel otherwise, and always for a mask whose last dimension's stride is not 1
      (every fused kernel's dense constraints: check_last_dim_stride_equals_1_dense)."""
    dtype, head, _, mask, _, gqa, grad = signature.split()
    if mask == "strided":
        return "math"
    head_dim, _, value_dim = head[1:].partition("v")
    dq, dv = int(head_dim), int(value_dim or head_dim)
    half = dtype in ("float16", "bfloat16")
    backward_fits = (dq <= 128 and dv <= 128) or (dq, dv) in ((192, 128), (256, 256))
    if prefer_cudnn and half and mask in ("nomask", "mask") and dq % 8 == 0 and dv % 8 == 0 \
            and dq <= 256 and dv <= 256 and (grad == "nograd" or backward_fits):
        return "cudnn"
    if half and mask == "nomask" and dq == dv <= 256:
        return "flash"
    if gqa == "gqa" or dq % (8 if half else 4) or dv % (8 if half else 4):
        return "math"
    return "efficient"


def device_slug(name: str) -> str:
    """"NVIDIA H200" -> "nvidia-h200": the calibration file's name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


class Table(Mapping[str, Any]):
    """A calibration's table (a kernel by signature, a ratio by kernel), read-only and hashable,
    so that a calibration is a value the prediction's caches can key on."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] = ()):
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Table({self._items!r})"


@dataclass(frozen=True)
class DeviceCalibration:
    device: str
    source: str  # how the figures were obtained: the command, the date, the versions
    workspace_forward_bytes: int
    workspace_backward_bytes: int
    context_bytes: int
    outside_bytes: int
    total_bytes: int
    sdpa_backends: Mapping[str, str] = field(default_factory=Table)
    attention_backward_bytes_per_element: Mapping[str, float] = field(default_factory=Table)
    calibration_set: tuple[str, ...] = ()  # the configurations the constants were fitted on
    fitted: bool = False  # False: DEFAULT's figures, not measured for this device
    # NCCL's own memory on each GPU of several (its buffers, streams, the communicator), outside
    # PyTorch's allocator: seen by NVML only. None until measured on this device.
    nccl_bytes: int | None = None
    usable_bytes: int | None = None  # None: total_bytes less DEFAULT's share for the driver
    edge_margin: float = 0.01
    edge_fitting_set: tuple[str, ...] = ()
    convolution_margin: float = 0.06  # uncalibrated: above the H200's (5.44 %)
    convolution_fitting_set: tuple[str, ...] = ()
    workspace_band: float = 0.6  # uncalibrated: above the H200's (0.554)
    workspace_band_fitting_set: tuple[str, ...] = ()
    multiprocessors: int | None = None  # None: DEFAULT's
    threads_per_multiprocessor: int | None = None

    def __post_init__(self) -> None:
        # Tables and sets as values: however a calibration was made (a file, `replace`), equal
        # figures make an equal, hashable calibration.
        for name in ("sdpa_backends", "attention_backward_bytes_per_element"):
            object.__setattr__(self, name, Table(getattr(self, name)))
        for name in ("calibration_set", "edge_fitting_set", "convolution_fitting_set",
                     "workspace_band_fitting_set"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def processors(self) -> tuple[int, int]:
        """(multiprocessors, threads a multiprocessor runs at once): this device's where
        recorded, else DEFAULT's."""
        known = self if self.multiprocessors and self.threads_per_multiprocessor else DEFAULT
        return known.multiprocessors, known.threads_per_multiprocessor

    def usable(self, total: int) -> int:
        """What a process may allocate on a device of `total` bytes (NVML's): this device's
        measured share, or DEFAULT's where it was not measured."""
        known = self if self.usable_bytes else DEFAULT
        return round(total * known.usable_bytes / known.total_bytes)

    def sdpa_backend(self, signature: str) -> str:
        return self.sdpa_backends.get(signature) or fallback_backend(
            signature, prefer_cudnn="cudnn" in self.sdpa_backends.values())

    def attention_backward_bytes(self, backend: str, query_elements: int, gqa: bool = False
                                 ) -> int:
        """A backward kernel's scratch; grouped-query attention's own figure where measured."""
        per = self.attention_backward_bytes_per_element
        ratio = per.get(f"{backend} gqa", per.get(backend, 0.0)) if gqa else \
            per.get(backend, 0.0)
        return int(ratio * query_elements)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sdpa_backends"] = dict(self.sdpa_backends)
        out["attention_backward_bytes_per_element"] = dict(self.attention_backward_bytes_per_element)
        out["calibration_set"] = list(self.calibration_set)
        out["edge_fitting_set"] = list(self.edge_fitting_set)
        out["convolution_fitting_set"] = list(self.convolution_fitting_set)
        out["workspace_band_fitting_set"] = list(self.workspace_band_fitting_set)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceCalibration:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: Path = CALIBRATION_DIR) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{device_slug(self.device)}.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path


# The H200 of docs/MEASUREMENTS.md (torch 2.11): context 528.8 MiB (kernel phase), 222-250 MiB
# outside the allocator at the peak, cuBLAS's 32 MiB a handle (Hopper's default workspace);
# NVML's 143,771 MiB of which the driver keeps 644,939,776 B (CUDA's "total capacity of
# 139.80 GiB"); 132 multiprocessors of 2,048 threads (Hopper's GH100 as the H200 ships it). A
# margin of 2 % of the capacity at the edge: the safe side of the fitted H200's.
DEFAULT = DeviceCalibration(
    device="NVIDIA H200", source="docs/MEASUREMENTS.md (bert-large, torch 2.11): not calibrated",
    workspace_forward_bytes=32 * MIB, workspace_backward_bytes=32 * MIB,
    context_bytes=529 * MIB, outside_bytes=250 * MIB, total_bytes=143_771 * MIB,
    usable_bytes=143_771 * MIB - 644_939_776, edge_margin=0.02, multiprocessors=132,
    threads_per_multiprocessor=2048)


def load(device_name: str | None, directory: Path = CALIBRATION_DIR) -> DeviceCalibration:
    """The device's calibration; DEFAULT (fitted=False) when it has none."""
    if device_name:
        path = directory / f"{device_slug(device_name)}.json"
        if path.is_file():
            return DeviceCalibration.from_dict(json.loads(path.read_text()))
    return DEFAULT


def calibrated(directory: Path = CALIBRATION_DIR) -> list[str]:
    """The GPU models with calibrated constants, by name."""
    return sorted(json.loads(path.read_text()).get("device", path.stem)
                  for path in directory.glob("*.json"))


def is_calibrated(device_name: str, directory: Path = CALIBRATION_DIR) -> bool:
    return (directory / f"{device_slug(device_name)}.json").is_file()


def calibrated_name(words: str, directory: Path = CALIBRATION_DIR) -> str | None:
    """The calibrated GPU model that `words` name, as NVML names it: its whole name or its last
    words, in any case ("NVIDIA H200", "nvidia h200", "H200" -> "NVIDIA H200"); None where they
    name none, or more than one."""
    wanted = device_slug(words)
    found = [name for name in calibrated(directory)
             if device_slug(name) == wanted or device_slug(name).endswith("-" + wanted)]
    return found[0] if len(found) == 1 else None
