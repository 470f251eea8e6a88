"""A model built with its task's head, offline: random weights made on the device (or only allocated
there, `materialise`, and given their values later, `initialise`), pretrained ones where the
local Hugging Face cache has them, LoRA's adapters on top.
"""

from __future__ import annotations

from contextlib import nullcontext

from anatomy.analysis.models.classes import head_class, head_config, transformers_config
from anatomy.analysis.models.freezing import freeze
from anatomy.analysis.models.lora import apply_lora
from anatomy.analysis.models.names import resolve
from anatomy.analysis.models.spec import ModelSpec
from anatomy.vocabulary import Attention, ModelSource, Weights

RANDOM_WEIGHTS = "random (from config)"  # build_model's source when no weights were cached


def _cached_weights(spec: ModelSpec) -> bool:
    if spec.hub_id is None:
        return False
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(spec.hub_id, name), str)
               for name in ("model.safetensors", "model.safetensors.index.json",
                            "pytorch_model.bin"))


# What save_pretrained writes a model's weights as (one file, or shards and their index).
WEIGHT_FILES = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json")


def unread_weights(spec: ModelSpec) -> str | None:
    """A weights file in the model's own folder, which a run does not read (`build_model` makes
    random weights of its config: the same memory); None where the folder holds none."""
    folder = spec.config_path.parent if spec.config_path is not None else None
    if spec.source != ModelSource.MODEL_FOLDER or folder is None:
        return None
    return next((found.name for pattern in WEIGHT_FILES for found in sorted(folder.glob(pattern))),
                None)


def build_model(spec: ModelSpec | str, device: str | None = None, *, lora_rank: int = 0,
                lora_targets: tuple[str, ...] = (), lora_dropout: float = 0.0,
                pretrained: bool = True, initialise: bool = True, weights: str = "fp32",
                attention: str = "sdpa", frozen: tuple[str, ...] = ()):
    """The model with its task's head, on `device`, and where its weights came from.

    Random weights are made on the device itself: no copy on the host first, so a 1 B-parameter
    model's weights phase takes seconds, and the device holds what it would hold after a copy.
    With `initialise=False` they are only allocated there, as a copy would allocate them (the
    model built on the meta device, then `materialise`), with no kernel run: `initialise(model)`
    gives them their random values later (CUDA loads the initialisers' kernels then, not while
    the weights are read). Weights are `weights` (fp32, or bf16 throughout) whatever the
    config's torch_dtype: over fp32 weights the Trainer autocasts (fp16/bf16). `attention`
    "eager" builds the eager attention; "sdpa" leaves transformers its own choice. `frozen`
    names the modules and parameters the training leaves as they are (freezing.py). With
    `lora_rank`, peft wraps the target modules with adapters (`lora_dropout` on their inputs;
    fp32 whatever the weights, as peft makes them) and freezes everything else (a classifier's
    new head trains too). Imports
    transformers (and torch) lazily: callers in the worker decide when that cost (and memory)
    lands.
    """
    import torch

    if isinstance(spec, str):  # a model as a run names it
        spec = resolve(spec)
    head = head_class(spec)
    config = head_config(head, transformers_config(spec))
    source = RANDOM_WEIGHTS
    model = None
    dtype = getattr(torch, Weights(weights).torch_name)
    # transformers' own choice unless eager is asked: sdpa asked of a model without it fails
    chosen = {"attn_implementation": "eager"} if Attention(attention) == Attention.EAGER else {}
    if pretrained and _cached_weights(spec):
        try:
            model = head.from_pretrained(spec.hub_id, config=config, local_files_only=True,
                                         dtype=dtype, ignore_mismatched_sizes=True, **chosen)
            model = model.to(device) if device is not None else model
            source = "pretrained (local cache)"
        except (OSError, ValueError):
            model = None  # not usable offline: random weights take the same memory
    deferred = model is None and not initialise and device not in (None, "meta")
    if model is None:
        where = "meta" if deferred else device
        with torch.device(where) if where is not None else nullcontext():
            model = head._from_config(config, dtype=dtype, **chosen)
    freeze(model, frozen)
    if lora_rank:
        model = apply_lora(model, spec, lora_rank, lora_targets, lora_dropout)
    if deferred:
        materialise(model, device)
    return model, source


def materialise(module, device: str, fresh: bool = False) -> None:
    """Storage on `device` for a model built on the meta device, allocated as `module.to(device)`
    would allocate it (children first, then each module's own parameters and buffers; a
    parameter shared by two modules once, a buffer once per module holding it), without running
    a kernel: the values are undefined until `initialise`. `fresh`: anew even where a tensor is
    on `device` already (the prediction follows the allocations on the meta device)."""
    import torch

    target = torch.device(device)
    made: dict[int, torch.nn.Parameter] = {}  # a parameter's new storage on the device
    placed: set[int] = set()

    def moves(tensor) -> bool:
        return tensor is not None and id(tensor) not in placed and \
            (fresh or tensor.device != target)

    def visit(current) -> None:
        for child in current.children():
            visit(child)
        for name, param in current._parameters.items():
            if id(param) in made:
                current._parameters[name] = made[id(param)]
            elif moves(param):
                made[id(param)] = torch.nn.Parameter(torch.empty_like(param, device=target),
                                                     param.requires_grad)
                placed.add(id(made[id(param)]))
                current._parameters[name] = made[id(param)]
        for name, buffer in current._buffers.items():
            if moves(buffer):
                current._buffers[name] = torch.empty_like(buffer, device=target)
                placed.add(id(current._buffers[name]))

    visit(module)


def initialise(model) -> None:
    """The random values transformers and peft give a model they build, for one whose storage
    `materialise` made: every module's own initialisation (buffers too: positions, rotary
    frequencies), the ties, then LoRA's adapters as peft starts them."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.no_grad():
        base.init_weights()
        for module in model.modules():
            if hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A"):
                # an embedding's adapters are lora_embedding_A and _B, its lora_A empty
                for adapter in (*module.lora_A, *getattr(module, "lora_embedding_A", ())):
                    module.reset_lora_parameters(
                        adapter, model.peft_config[adapter].init_lora_weights)
