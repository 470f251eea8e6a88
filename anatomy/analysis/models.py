"""Models: a config (a shipped preset, a config.json or model folder, or a Hub id already in the
local cache) and the task head its architecture trains with. Built with random weights offline.

Random weights take exactly the memory pretrained ones do, so every model works without the Hub;
pretrained weights are used when they are already in the local Hugging Face cache. Everything a
run needs to know before it starts (the task, the limits of the options) is read from the config
file alone, without transformers (which loads torch: seconds); `build_model` imports them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).parent / "configs"

# The task head follows the architecture; the dummy dataset follows the head.
SEQUENCE_CLASSIFICATION = "sequence classification"
CAUSAL_LM = "causal language modelling"
IMAGE_CLASSIFICATION = "image classification"
TASKS = (SEQUENCE_CLASSIFICATION, CAUSAL_LM, IMAGE_CLASSIFICATION)
NUM_LABELS = 2  # the walkthrough's binary labels, for sequence classification

# Where a config keeps its longest sequence (GPT-2 names it n_positions).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
# Architectures' class-name endings, in the order they are tried.
_HEADS_BY_SUFFIX = (
    ("ForImageClassification", IMAGE_CLASSIFICATION),
    ("ForCausalLM", CAUSAL_LM),
    ("LMHeadModel", CAUSAL_LM),
    ("ForSequenceClassification", SEQUENCE_CLASSIFICATION),
    ("ForMaskedLM", SEQUENCE_CLASSIFICATION),
    ("ForPreTraining", SEQUENCE_CLASSIFICATION),
    ("Model", SEQUENCE_CLASSIFICATION),
)
# Decoder-only families, for configs that name no architecture.
_DECODER_TYPES = frozenset({
    "gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3",
    "phi", "phi3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "opt", "bloom", "falcon",
    "starcoder2", "stablelm", "granite", "cohere", "smollm3"})


# LoRA: the modules the adapters wrap by default, and every linear layer a target may name, per
# model type (the names transformers 5.23 gives them; the tests check both against the built
# models). Defaults as peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING has them: the
# attention's query and value projections; ViT, which it lacks, likewise. Other model types:
# peft's table decides.
LORA_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "bert": ("query", "value"), "roberta": ("query", "value"), "vit": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",), "llama": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
}
_LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEAR_MODULES: dict[str, tuple[str, ...]] = {
    "bert": ("query", "key", "value", "dense"), "roberta": ("query", "key", "value", "dense"),
    "vit": ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "llama": _LLAMA_LINEAR, "qwen2": _LLAMA_LINEAR, "mistral": _LLAMA_LINEAR,
}


class ModelError(ValueError):
    """A model that cannot be used, in one line naming what is wrong."""


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str | None  # where pretrained weights would come from, if cached locally
    description: str

    @property
    def config_path(self) -> Path:
        return CONFIG_DIR / f"{self.name}.json"

    def config_dict(self) -> dict:
        return json.loads(self.config_path.read_text())


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("bert-large-uncased", "google-bert/bert-large-uncased",
               "BERT large, 24 layers, hidden 1024: the walkthrough's model (default on a GPU)"),
        Preset("bert-base-uncased", "google-bert/bert-base-uncased",
               "BERT base, 12 layers, hidden 768"),
        Preset("gpt2", "openai-community/gpt2", "GPT-2, 124 M parameters: a decoder LM"),
        Preset("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
               "TinyLlama 1.1 B: the Llama architecture, 22 layers, hidden 2048, grouped-query"
               " attention"),
        Preset("qwen2-0.5b", "Qwen/Qwen2-0.5B",
               "Qwen2 0.5 B: 24 layers, hidden 896, a 151,936-token vocabulary"),
        Preset("vit-base-patch16-224", "google/vit-base-patch16-224",
               "ViT-base/16: an image classifier on 224×224 images, 1000 classes"),
        Preset("tiny", None, "tiny BERT, 2 layers, hidden 128: for CPU demos (default without a GPU)"),
        Preset("tiny-gpt2", None, "tiny GPT-2, 2 layers, hidden 64: for CPU tests"),
        Preset("tiny-llama", None, "tiny Llama, 2 layers, hidden 64, grouped-query attention"),
        Preset("tiny-qwen2", None, "tiny Qwen2, 2 layers, hidden 64, tied embeddings"),
        Preset("tiny-vit", None, "tiny ViT, 2 layers, hidden 64, 32×32 images"),
    )
}

GPU_DEFAULT = "bert-large-uncased"
CPU_DEFAULT = "tiny"


def default_preset(has_gpu: bool) -> str:
    return GPU_DEFAULT if has_gpu else CPU_DEFAULT


@dataclass(frozen=True)
class ModelSpec:
    """A model as a run names it, resolved: its config and where it came from."""

    name: str  # as the run option holds it: a preset, a path or a Hub id
    source: str  # "preset", "config file", "model folder" or "Hub cache"
    config: Mapping[str, Any] = field(compare=False)
    config_path: Path | None = None
    hub_id: str | None = None  # pretrained weights may be in the local cache under this id

    @property
    def display_name(self) -> str:
        return display_name(self.name)

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def task(self) -> str:
        return task_of(self.config)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the config allows (None: no limit in the config, or images)."""
        if self.task == IMAGE_CLASSIFICATION:
            return None
        return next((self.config[k] for k in POSITION_KEYS if isinstance(self.config.get(k), int)),
                    None)

    @property
    def vocab_size(self) -> int | None:
        return self.config.get("vocab_size")

    @property
    def image_size(self) -> int | None:
        size = self.config.get("image_size")
        return size if self.task == IMAGE_CLASSIFICATION else None

    @property
    def num_channels(self) -> int:
        return self.config.get("num_channels", 3)

    @property
    def num_labels(self) -> int:
        """Labels of the classification head: the config's for images, 2 for text (the
        walkthrough's binary labels); a causal LM's labels are its input ids."""
        if self.task == IMAGE_CLASSIFICATION:
            if isinstance(self.config.get("num_labels"), int):
                return self.config["num_labels"]
            return len(self.config.get("id2label") or {}) or NUM_LABELS
        return NUM_LABELS


def display_name(model: str) -> str:
    """What lists and titles call a model: a preset's or a Hub id's name, a path's folder (or its
    file name without .json when the file is not called config.json)."""
    if model in PRESETS or not _looks_like_path(model):
        return model
    path = Path(model)
    if path.name == "config.json" or (not path.suffix and path.name):
        return (path.parent.name if path.name == "config.json" else path.name) or model
    return path.stem or model


def _looks_like_path(text: str) -> bool:
    return (os.sep in text and not _is_hub_id(text)) or text.endswith(".json") or \
        text.startswith((".", "~")) or Path(text).exists()


def _is_hub_id(text: str) -> bool:
    """"org/name", the shape of a Hub id (a relative path of two parts has it too: a path that
    exists wins)."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "/", "~")) and \
        not Path(text).exists()


def task_of(config: Mapping[str, Any]) -> str:
    """The head a config trains with: its architecture's class name decides; without one, an
    image size without a vocabulary means images, a decoder family causal language modelling,
    anything else an encoder with a sequence-classification head."""
    for architecture in config.get("architectures") or ():
        for suffix, task in _HEADS_BY_SUFFIX:
            if isinstance(architecture, str) and architecture.endswith(suffix):
                return task
    if "image_size" in config and "vocab_size" not in config:
        return IMAGE_CLASSIFICATION
    if config.get("is_decoder") or config.get("model_type") in _DECODER_TYPES:
        return CAUSAL_LM
    return SEQUENCE_CLASSIFICATION


@lru_cache(maxsize=1)
def known_model_types() -> frozenset[str] | None:
    """The model types the installed transformers can build, read from its generated table
    (transformers/models/auto/auto_mappings.py, plain data) without importing transformers,
    which would load torch: seconds for a check that the form makes on every click. None when
    the table is not where this version keeps it: the build then judges."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "auto_mappings.py"
    if not path.is_file():
        return None
    loader = importlib.util.spec_from_file_location("_anatomy_auto_mappings", path)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
        return frozenset(module.CONFIG_MAPPING_NAMES)
    except Exception:  # noqa: BLE001 - a changed file only loses the early check
        return None


def _read_config(path: Path, shown: str) -> dict:
    try:
        text = path.read_text()
    except OSError as error:
        raise ModelError(f"model: cannot read {shown}: {error.strerror}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelError(f"model: {shown} is not valid JSON: {error.msg} at line {error.lineno}"
                         ) from None
    if not isinstance(config, dict):
        raise ModelError(f"model: {shown} holds a JSON {type(config).__name__}, not a config object")
    return config


def _hub_config(model_id: str) -> Path | None:
    """The config.json of a Hub id in the local cache (HF_HOME / HF_HUB_CACHE), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model_id, "config.json")
    return Path(found) if isinstance(found, str) else None


@lru_cache(maxsize=256)
def _resolve(model: str, mtime: float | None) -> ModelSpec:
    if model in PRESETS:
        preset = PRESETS[model]
        return ModelSpec(model, "preset", preset.config_dict(), preset.config_path, preset.hub_id)
    path = Path(model).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelError(f"model: the folder {model} has no config.json")
        return ModelSpec(model, "model folder", _read_config(config_path, f"{model}/config.json"),
                         config_path)
    if path.is_file():
        return ModelSpec(model, "config file", _read_config(path, model), path)
    if _is_hub_id(model):
        config_path = _hub_config(model)
        if config_path is None:
            raise ModelError(f"model: {model!r} is not in the local Hugging Face cache (the Hub is "
                             "not reached; a shipped preset or a path to a config.json works "
                             f"offline; presets: {', '.join(PRESETS)})")
        return ModelSpec(model, "Hub cache", _read_config(config_path, f"{model}'s config.json"),
                         config_path, model)
    if _looks_like_path(model):
        raise ModelError(f"model: no such file or folder: {model}")
    raise ModelError(f"model: {model!r} is not a preset ({', '.join(PRESETS)}), a path to a "
                     "config.json or a model folder, or a Hub id (org/name) in the local cache")


def resolve(model: str) -> ModelSpec:
    """The model a run names, with its config; ModelError (one line) when it cannot be used."""
    if not isinstance(model, str) or not model.strip():
        raise ModelError("model: give a preset, a path to a config.json or a model folder, or a "
                         "Hub id")
    path = Path(model).expanduser()
    mtime = path.stat().st_mtime if model not in PRESETS and path.exists() else None
    spec = _resolve(model.strip(), mtime)
    check_config(spec)
    return spec


def check_config(spec: ModelSpec) -> None:
    """What can be told wrong from the config file alone, in one line each."""
    config, where = spec.config, f"model: {spec.display_name}"
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError(f"{where}: the config has no model_type (e.g. \"llama\", \"bert\")")
    known = known_model_types()
    if known is not None and model_type not in known:
        raise ModelError(f"{where}: transformers does not know model_type {model_type!r}")
    for key, value in config.items():
        if key.startswith(("num_", "n_", "hidden_size", "intermediate_size", "vocab_size",
                           "image_size", "patch_size", "max_position")) and (
                isinstance(value, bool) or (isinstance(value, (int, float)) and value <= 0)):
            raise ModelError(f"{where}: {key} must be a positive number, got {value!r}")
    heads = config.get("num_attention_heads", config.get("n_head"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if isinstance(heads, int) and isinstance(hidden, int) and "head_dim" not in config \
            and hidden % heads:
        raise ModelError(f"{where}: hidden size {hidden} is not divisible by the "
                         f"{heads} attention heads")
    if spec.task == IMAGE_CLASSIFICATION and not isinstance(config.get("image_size"), int):
        raise ModelError(f"{where}: an image classifier's config needs an image_size")
    if spec.task != IMAGE_CLASSIFICATION and not isinstance(config.get("vocab_size"), int):
        raise ModelError(f"{where}: a text model's config needs a vocab_size")


def token_range(spec: ModelSpec) -> tuple[int, int]:
    """The dummy data's token ids: the walkthrough's [100, 30000), within the vocabulary (a tiny
    one's start at 0)."""
    high = min(30000, spec.vocab_size or 30000)
    return (100 if high > 200 else 0), high


def linear_module_names(spec: ModelSpec) -> tuple[str, ...]:
    return LINEAR_MODULES.get(spec.model_type, ())


def unknown_lora_targets(spec: ModelSpec, targets: tuple[str, ...]) -> list[str]:
    """Targets that name no linear layer of this model type (a dotted name is judged by its last
    part); empty for model types this table does not know: peft judges them when building."""
    known = LINEAR_MODULES.get(spec.model_type)
    if known is None:
        return []
    return [t for t in targets if t.split(".")[-1] not in known]


def lora_target_modules(spec: ModelSpec, chosen: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The modules LoRA wraps: the chosen ones, else the model type's default; None lets peft
    pick from its own table."""
    return chosen or LORA_DEFAULT_TARGETS.get(spec.model_type)


def parameter_count(config: dict, num_labels: int = NUM_LABELS) -> int:
    """Parameters of BertForSequenceClassification for a BERT config, counted from its shape: a
    cross-check of the traced prediction, which counts any model's parameters from the model."""
    h = config["hidden_size"]
    layers = config["num_hidden_layers"]
    inter = config["intermediate_size"]
    embeddings = (config["vocab_size"] + config["max_position_embeddings"]
                  + config["type_vocab_size"]) * h + 2 * h  # + LayerNorm
    per_layer = (
        4 * (h * h + h)          # query, key, value, attention output
        + 2 * h                  # attention LayerNorm
        + h * inter + inter      # intermediate
        + inter * h + h          # output
        + 2 * h                  # output LayerNorm
    )
    pooler = h * h + h
    classifier = h * num_labels + num_labels
    return embeddings + layers * per_layer + pooler + classifier


def transformers_config(spec: ModelSpec):
    """The transformers config object for the model's task head."""
    from transformers import AutoConfig

    values = {k: v for k, v in spec.config.items()
              if k not in ("model_type", "transformers_version", "torch_dtype", "dtype")}
    values["num_labels"] = spec.num_labels
    values.pop("id2label", None) if spec.task != IMAGE_CLASSIFICATION else None
    values.pop("label2id", None) if spec.task != IMAGE_CLASSIFICATION else None
    config = AutoConfig.for_model(spec.model_type, **values)
    if spec.task == SEQUENCE_CLASSIFICATION and getattr(config, "pad_token_id", None) is None:
        # A decoder's classification head finds each sequence's last token by its padding id.
        config.pad_token_id = getattr(config, "eos_token_id", None) or 0
    return config


def _head_class(task: str):
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageClassification,
        AutoModelForSequenceClassification,
    )

    return {SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
            CAUSAL_LM: AutoModelForCausalLM,
            IMAGE_CLASSIFICATION: AutoModelForImageClassification}[task]


def _cached_weights(spec: ModelSpec) -> bool:
    if spec.hub_id is None:
        return False
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(spec.hub_id, name), str)
               for name in ("model.safetensors", "model.safetensors.index.json",
                            "pytorch_model.bin"))


def build_model(spec: ModelSpec | str, device: str | None = None, *, lora_rank: int = 0,
                lora_targets: tuple[str, ...] = (), pretrained: bool = True,
                initialise: bool = True):
    """The model with its task's head, on `device`, and where its weights came from.

    Random weights are made on the device itself: no copy on the host first, so a 1 B-parameter
    model's weights phase takes seconds, and the device holds what it would hold after a copy.
    With `initialise=False` they are only allocated there, as a copy would allocate them (the
    model built on the meta device, then `materialise`), with no kernel run: `initialise(model)`
    gives them their random values later (CUDA loads the initialisers' kernels then, not while
    the weights are read). Weights are fp32 whatever the config's torch_dtype: the Trainer keeps
    fp32 weights and autocasts (fp16/bf16). With `lora_rank`, peft wraps the target modules with
    adapters and freezes everything else (a classifier's new head trains too). Imports
    transformers (and torch) lazily: callers in the worker decide when that cost (and memory)
    lands.
    """
    import torch

    if isinstance(spec, str):  # a model as a run names it
        spec = resolve(spec)
    head = _head_class(spec.task)
    config = transformers_config(spec)
    source = "random (from config)"
    model = None
    if pretrained and _cached_weights(spec):
        try:
            model = head.from_pretrained(spec.hub_id, config=config, local_files_only=True,
                                         dtype=torch.float32, ignore_mismatched_sizes=True)
            model = model.to(device) if device is not None else model
            source = "pretrained (local cache)"
        except (OSError, ValueError):
            model = None  # not usable offline: random weights take the same memory
    deferred = model is None and not initialise and device not in (None, "meta")
    if model is None:
        where = "meta" if deferred else device
        with torch.device(where) if where is not None else nullcontext():
            model = head.from_config(config, dtype=torch.float32)
    if lora_rank:
        model = apply_lora(model, spec, lora_rank, lora_targets)
    if deferred:
        materialise(model, device)
    return model, source


def materialise(module, device: str) -> None:
    """Storage on `device` for a model built on the meta device, allocated as `module.to(device)`
    would allocate it (children first, then each module's own parameters and buffers; a
    parameter shared by two modules once, a buffer once per module holding it), without running
    a kernel: the values are undefined until `initialise`."""
    import torch

    target = torch.device(device)
    made: dict[int, torch.nn.Parameter] = {}  # a meta parameter's storage on the device

    def visit(current) -> None:
        for child in current.children():
            visit(child)
        for name, param in current._parameters.items():
            if param is not None and param.device != target:
                if id(param) not in made:
                    made[id(param)] = torch.nn.Parameter(
                        torch.empty_like(param, device=target), param.requires_grad)
                current._parameters[name] = made[id(param)]
        for name, buffer in current._buffers.items():
            if buffer is not None and buffer.device != target:
                current._buffers[name] = torch.empty_like(buffer, device=target)

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
                for adapter in module.lora_A:
                    module.reset_lora_parameters(
                        adapter, model.peft_config[adapter].init_lora_weights)


def apply_lora(model, spec: ModelSpec, rank: int, targets: tuple[str, ...] = ()):
    """peft's LoRA on the model: adapters of rank `rank` on the target modules, everything else
    frozen; for classification the head, which the task adds, trains as well."""
    from peft import LoraConfig, TaskType, get_peft_model

    task_type = {SEQUENCE_CLASSIFICATION: TaskType.SEQ_CLS, CAUSAL_LM: TaskType.CAUSAL_LM
                 }.get(spec.task)
    config = LoraConfig(r=rank, target_modules=list(lora_target_modules(spec, targets) or []) or None,
                        task_type=task_type,
                        modules_to_save=["classifier"] if spec.task == IMAGE_CLASSIFICATION
                        else None)
    try:
        return get_peft_model(model, config)
    except ValueError as error:
        raise ModelError(f"lora_targets: {error}") from None


def fsdp_unit_classes(model) -> list[str]:
    """The classes FSDP makes its units of: the model's own `_no_split_modules` (transformers'
    names for its layers) less any that holds the input embeddings. accelerate (1.15) shards the
    input embeddings as a unit of their own after the layers, and a module already inside a unit
    fails there (BERT lists BertEmbeddings: "value was None when it should not be", seen on two
    H200s with torch 2.11). The worker's fsdp_config and the prediction's trace both use it."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    keep = set()
    for module in model.modules():
        name = type(module).__name__
        if name in names and not any(inner is embeddings for inner in module.modules()):
            keep.add(name)
    return sorted(keep)
