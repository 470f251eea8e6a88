"""Models: a config (a shipped preset, a config.json or model folder, or a Hub id already in the
local cache) and the task head its architecture trains with. Built with random weights offline.

Random weights take exactly the memory pretrained ones do, so every model works without the Hub;
pretrained weights are used when they are already in the local Hugging Face cache. Everything a
run needs to know before it starts (the task, the limits of the options) is read from the config
file alone, without transformers (which loads torch: seconds); `build_model` imports them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import os
import re
import warnings
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from anatomy.analysis.cache import cache_dir, write_atomically
from anatomy.units import mib_text
from anatomy.vocabulary import ModelSource

CONFIG_DIR = Path(__file__).parent / "configs"

# The task head follows the architecture; the dummy dataset follows the head.
SEQUENCE_CLASSIFICATION = "sequence classification"
CAUSAL_LM = "causal language modelling"
IMAGE_CLASSIFICATION = "image classification"
SEQ2SEQ = "sequence to sequence"
TOKEN_CLASSIFICATION = "token classification"  # a label per token: named entities, parts of speech
TASKS = (SEQUENCE_CLASSIFICATION, CAUSAL_LM, IMAGE_CLASSIFICATION, SEQ2SEQ, TOKEN_CLASSIFICATION)
# The tasks whose head is a classifier of the config's labels (`ModelSpec.num_labels`).
CLASSIFICATIONS = (SEQUENCE_CLASSIFICATION, IMAGE_CLASSIFICATION, TOKEN_CLASSIFICATION)
NUM_LABELS = 2  # the walkthrough's binary labels, for a classifier whose config names none
IMAGE_SIZE = 224  # what image classifiers train on when their config names no size

# transformers' own tables of the heads (models/auto/modeling_auto.py), per task. A model type
# without `architectures` trains the first of these its type has (an encoder with a masked-LM
# head classifies sequences, as the walkthrough's BERT does); token classification only where the
# config's `architectures` names its head (a type's token head is never its default).
TASK_MAPPINGS: dict[str, tuple[str, ...]] = {
    IMAGE_CLASSIFICATION: ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    SEQ2SEQ: ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
              "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    CAUSAL_LM: ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
    SEQUENCE_CLASSIFICATION: ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
    TOKEN_CLASSIFICATION: ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
}
_HEADS_TRAINED = ("causal-LM, sequence-classification, token-classification, "
                  "image-classification and sequence-to-sequence heads")  # for a refusal
_ENCODER_MAPPING = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"
# Heads that are no task of their own: the type's task trains instead.
_BODY_MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_PRETRAINING_MAPPING_NAMES", _ENCODER_MAPPING)

# Where a config keeps its longest sequence (GPT-2 names it n_positions, Whisper's decoder
# max_target_positions).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                 "max_target_positions")
# Architectures' class-name endings, for a class transformers' tables do not list.
_HEADS_BY_SUFFIX = (
    ("ForImageClassification", IMAGE_CLASSIFICATION),
    ("ForCausalLM", CAUSAL_LM),
    ("LMHeadModel", CAUSAL_LM),
    ("ForConditionalGeneration", SEQ2SEQ),
    ("ForSequenceClassification", SEQUENCE_CLASSIFICATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ("ForMaskedLM", SEQUENCE_CLASSIFICATION),
    ("ForPreTraining", SEQUENCE_CLASSIFICATION),
    ("Model", SEQUENCE_CLASSIFICATION),
)
# Sub-configs that make a model of several towers (CLIP's text and vision encoders).
_TOWERS = ("text_config", "vision_config", "audio_config", "speech_config")


# LoRA: peft's own defaults (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) where peft has
# the model type; for any other model the attention's query and value projections found among its
# own linear layers (`default_lora_targets`).
_QUERY_VALUE = re.compile(r"^(q|v|query|value|q_proj|v_proj|q_lin|v_lin|query_proj|value_proj)$")
_FUSED_QKV = re.compile(r"qkv|c_attn|query_key_value|in_proj")

# peft's word for every linear layer but the output layer, as QLoRA's recipes name their targets
ALL_LINEAR = "all-linear"

RANDOM_WEIGHTS = "random (from config)"  # build_model's source when no weights were cached


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
    source: ModelSource
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
        return task_and_head(self.config)[0]

    @property
    def head(self) -> str | None:
        """The head's class in transformers (None: the task's Auto class picks it)."""
        return task_and_head(self.config)[1]

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the config allows (None: no limit in the config, or images)."""
        if self.task == IMAGE_CLASSIFICATION:
            return None
        return next((self.config[k] for k in POSITION_KEYS if isinstance(self.config.get(k), int)),
                    None)

    @property
    def vocab_size(self) -> int | None:
        """The tokens the inputs may hold: the config's, or its text tower's (a multimodal
        model's), else the smallest of its own vocabularies (FSMT's source and target)."""
        for config in (self.config, self.config.get("text_config"), self.config.get("decoder")):
            if isinstance(config, Mapping) and isinstance(config.get("vocab_size"), int):
                return config["vocab_size"]
        own = [v for k, v in self.config.items() if k.endswith("_vocab_size")
               and k != "type_vocab_size" and isinstance(v, int) and not isinstance(v, bool)]
        return min(own, default=None)

    @property
    def image_size(self) -> int | None:
        """The images' side: the config's, or 224 where it names none (ResNet, RegNet)."""
        if self.task != IMAGE_CLASSIFICATION:
            return None
        size = self.config.get("image_size")
        if isinstance(size, list) and size and isinstance(size[0], int):
            size = size[0]
        return size if isinstance(size, int) and not isinstance(size, bool) else IMAGE_SIZE

    def audio_features(self, seq_len: int) -> tuple[int, int] | None:
        """A speech encoder's log-mel input, one sample's shape: Whisper's (mel bins, frames: two
        per encoder position, which it requires), or `seq_len` frames of the features
        Speech2Text's config or a Parakeet encoder's (Canary's, Cohere ASR's) names; None for a
        config that names none."""
        if self.task != SEQ2SEQ:
            return None
        config = self.config
        bins, positions = config.get("num_mel_bins"), config.get("max_source_positions")
        if isinstance(bins, int) and isinstance(positions, int):
            return bins, 2 * positions
        per_channel = config.get("input_feat_per_channel")
        if isinstance(per_channel, int):
            return seq_len, per_channel * (config.get("input_channels") or 1)
        encoder = config.get("encoder_config") or config.get("encoder") or {}
        bins = encoder.get("num_mel_bins", bins) if isinstance(encoder, dict) else bins
        return (seq_len, bins) if isinstance(bins, int) else None

    @property
    def decoder_start_token_id(self) -> int:
        """The token a decoder's inputs begin with (the labels shifted right behind it), as the
        model's own `shift_tokens_right` takes it."""
        for config in (self.config, self.config.get("decoder") or {}):
            for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
                if isinstance(config.get(key), int):
                    return config[key]
        return 0

    @property
    def num_channels(self) -> int:
        return self.config.get("num_channels", 3)

    @property
    def num_labels(self) -> int:
        """Labels of the classification head: the config's (num_labels, else its id2label's),
        else 2 (the walkthrough's binary labels); a causal LM's labels are its input ids.
        `check_config` refuses a classifier's num_labels below 1."""
        if self.task in CLASSIFICATIONS:
            count = self.config.get("num_labels")
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                return count
            labels = self.config.get("id2label")
            return len(labels) if isinstance(labels, dict) and labels else NUM_LABELS
        return NUM_LABELS


def first_line(error: BaseException) -> str:
    """An exception as one line: its first line (with the next where the first only announces
    it, "Validation error for field 'x':"), or its type where it has no words."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for line in lines[1:]:
        if not text.endswith(":"):
            break
        text += " " + line
    return (text if len(text) <= 300 else text[:297] + "...") or type(error).__name__


def where_it_stopped(error: BaseException) -> str:
    """The model's own code where an error stopped it ("modeling_x.py, XAttention.forward: "): the
    part a trace could not follow, the layer its config could not make; empty when it stopped
    elsewhere (in torch, in anatomy)."""
    found = ""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if "/transformers/models/" in code.co_filename.replace("\\", "/"):
            found = (f"{code.co_filename.replace(chr(92), '/').rsplit('/', 1)[-1]}, "
                     f"{getattr(code, 'co_qualname', code.co_name)}: ")
        tb = tb.tb_next
    return found


def display_name(model: str) -> str:
    """What lists and titles call a model: a preset's or a Hub id's name, a path's folder (or its
    file name without .json when the file is not called config.json)."""
    if model in PRESETS or not _looks_like_path(model):
        return model
    path = Path(model)
    cached = next((part for part in path.parts if _HUB_FOLDER.fullmatch(part)), None)
    if cached is not None:  # a folder of the local Hub cache: its model's id
        return "/".join(_HUB_FOLDER.fullmatch(cached).groups())
    if path.name == "config.json":
        return path.parent.name or model
    # A folder's name keeps its dots (Meta-Llama-3.1-8B, Qwen2.5-7B); a file loses its .json.
    return (path.stem if path.suffix.lower() == ".json" else path.name) or model


# A model's folder in the local Hugging Face cache (huggingface_hub's layout): its config in
# snapshots/<revision>/, the revision of "main" in refs/main.
_HUB_FOLDER = re.compile(r"models--([^/]+?)--([^/]+)")


def _config_of_folder(folder: Path) -> Path:
    """The config.json of a model folder: its own, else (a model's folder in the local Hub
    cache) its main revision's."""
    own = folder / "config.json"
    if own.is_file() or not _HUB_FOLDER.fullmatch(folder.name):
        return own
    try:
        revision = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return own
    return folder / "snapshots" / revision / "config.json"


def _looks_like_path(text: str) -> bool:
    return (os.sep in text and not _is_hub_id(text)) or text.endswith(".json") or \
        text.startswith((".", "~")) or _exists(Path(text))


def _is_hub_id(text: str) -> bool:
    """"org/name", the shape of a Hub id (a relative path of two parts has it too: a path that
    exists wins)."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "/", "~")) and \
        not _exists(Path(text))


@lru_cache(maxsize=1)
def auto_mappings() -> dict[str, dict[str, str]]:
    """transformers' tables of model types to head classes (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and
    its kin), read as plain data from models/auto/modeling_auto.py without importing transformers
    (which loads torch: seconds); a tuple of classes keeps its first. Empty when this version
    keeps them elsewhere: the class names' endings then judge."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return {}
    found: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("NAMES")
                and isinstance(node.value, ast.Call) and node.value.args):
            continue
        try:
            pairs = ast.literal_eval(node.value.args[0])
        except ValueError:
            continue
        found[node.targets[0].id] = {t: c[0] if isinstance(c, tuple) else c for t, c in pairs}
    return found


def _task_of_class(name: str) -> str | None:
    tables = auto_mappings()
    for task, mappings in TASK_MAPPINGS.items():
        if any(name in tables.get(m, {}).values() for m in mappings):
            return task
    return None


def head_of_type(model_type: str) -> str | None:
    """The head class a model type trains with when its config names none: transformers' first
    table (TASK_MAPPINGS' order) that has the type; an encoder with a masked-LM head classifies
    sequences (the walkthrough's BERT) rather than generate."""
    tables = auto_mappings()
    encoder = model_type in tables.get(_ENCODER_MAPPING, {})
    order = [IMAGE_CLASSIFICATION, SEQ2SEQ] + (
        [SEQUENCE_CLASSIFICATION, CAUSAL_LM] if encoder else [CAUSAL_LM, SEQUENCE_CLASSIFICATION])
    for task in order:
        for mapping in TASK_MAPPINGS[task]:
            head = tables.get(mapping, {}).get(model_type)
            if head is not None:
                return head
    return None


def head_task(head: str) -> str | None:
    """The task a head class trains (by transformers' tables), before the config decides
    whether a sequence-to-sequence head is an encoder-decoder."""
    return _task_of_class(head)


def _encoder_decoder(config: Mapping[str, Any]) -> bool:
    """An encoder-decoder (T5, BART, Whisper) rather than a decoder behind other towers (an audio
    LM in transformers' sequence-to-sequence table: its text trains as a causal LM)."""
    value = config.get("is_encoder_decoder")
    return value if isinstance(value, bool) else not any(k in config for k in _TOWERS)


def task_and_head(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """The task a config trains and its head class (None: the task's Auto class picks). The
    architecture's class decides where transformers' tables list it as one of the tasks' heads;
    a body (the bare model, a masked-LM or pre-training head) trains its model type's task;
    ModelError for a bare model of two towers (CLIP), which has no task head."""
    model_type = config.get("model_type")
    architecture = next((a for a in config.get("architectures") or () if isinstance(a, str)),
                        None)
    if architecture is not None:
        task = _task_of_class(architecture)
        if task is None and not any(architecture in auto_mappings().get(m, {}).values()
                                    for m in _BODY_MAPPINGS):
            # a class these tables do not list (another version's): its name's ending
            task = next((t for suffix, t in _HEADS_BY_SUFFIX if architecture.endswith(suffix)),
                        None)
            if task is None:
                _refuse_other_head(architecture, model_type)
            architecture = None
        if task is not None and (task != SEQUENCE_CLASSIFICATION or architecture is not None
                                 or head_of_type(model_type) is None):
            return _decoder_only(task, config), architecture
        towers = [k for k in _TOWERS if isinstance(config.get(k), dict)]
        if len(towers) > 1 and architecture in auto_mappings().get("MODEL_MAPPING_NAMES",
                                                                    {}).values():
            raise ModelError(
                f"model: {architecture} is a model of {len(towers)} towers ({', '.join(towers)}) "
                f"trained by contrasting them, with no task head: anatomy trains {_HEADS_TRAINED}")
    head = head_of_type(model_type) if isinstance(model_type, str) else None
    if head is not None:
        return _decoder_only(_task_of_class(head), config), head
    if "image_size" in config and "vocab_size" not in config:
        return IMAGE_CLASSIFICATION, None
    if config.get("is_decoder"):
        return CAUSAL_LM, None
    return SEQUENCE_CLASSIFICATION, None


def _refuse_other_head(architecture: str, model_type: object) -> None:
    """ModelError for a head of a task anatomy does not train (question answering, multiple
    choice…), where transformers' tables list it: the type's own head would be trained in its
    place — for a decoder, a vocabulary-wide output the user's model does not have."""
    tables = auto_mappings()
    table = next((m for m, heads in tables.items()
                  if m.startswith("MODEL_FOR_") and architecture in heads.values()), None)
    if table is None:
        return  # a class of another version's: the type's task trains
    what = table.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES").lower()
    instead = tables.get("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", {}).get(model_type)
    raise ModelError(
        f"model: {architecture} is a {what.replace('_', ' ')} head: anatomy trains "
        f"{_HEADS_TRAINED}"
        + (f" (architectures: [\"{instead}\"] predicts the same body with one)" if instead
           else ""))


def _decoder_only(task: str, config: Mapping[str, Any]) -> str:
    return CAUSAL_LM if task == SEQ2SEQ and not _encoder_decoder(config) else task


def task_of(config: Mapping[str, Any]) -> str:
    """The head a config trains with (`task_and_head`)."""
    return task_and_head(config)[0]


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


CONFIG_MAX_BYTES = 16 * 2**20  # the largest published config.json is a few hundred KB


def _read_config(path: Path, shown: str) -> dict:
    """The config file's object; ModelError, in one line, for anything that is not one (a
    weights file named by mistake is read no further than its size or its first bytes)."""
    try:
        size = path.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise ModelError(f"model: {shown} is {mib_text(size)}, not a config.json (a "
                             "weights file?): name the config.json or the model's folder")
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ModelError(f"model: cannot read {shown}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ModelError(f"model: {shown} is not UTF-8 text (byte {error.start}), not a "
                         "config.json (a weights file?)") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelError(f"model: {shown} is not valid JSON: {error.msg} at line {error.lineno}"
                         ) from None
    except ValueError:
        raise ModelError(f"model: {shown} holds a number of more digits than Python reads, not "
                         "a config") from None
    except RecursionError:
        raise ModelError(f"model: {shown} is nested too deeply to be a config") from None
    if not isinstance(config, dict):
        raise ModelError(f"model: {shown} holds a JSON {type(config).__name__}, not a config object")
    return config


def _short(text: str) -> str:
    """A name as a message quotes it: its first and last characters when it is long."""
    return text if len(text) <= 80 else f"{text[:40]}…{text[-30:]}"


def _hub_config(model_id: str) -> Path | None:
    """The config.json of a Hub id in the local cache (HF_HOME / HF_HUB_CACHE), or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except ValueError:  # no Hub id after all (huggingface_hub's own rules: length, characters)
        return None
    return Path(found) if isinstance(found, str) else None


@lru_cache(maxsize=256)
def _resolve(model: str, version: tuple[int, int] | None) -> ModelSpec:
    if model in PRESETS:
        preset = PRESETS[model]
        return ModelSpec(model, ModelSource.PRESET, preset.config_dict(), preset.config_path, preset.hub_id)
    path = Path(model).expanduser()
    if path.is_dir():
        config_path = _config_of_folder(path)
        if not config_path.is_file():
            raise ModelError(f"model: the folder {_short(model)} has no config.json")
        return ModelSpec(model, ModelSource.MODEL_FOLDER, _read_config(config_path, f"{model}/config.json"),
                         config_path)
    if path.is_file():
        return ModelSpec(model, ModelSource.CONFIG_FILE, _read_config(path, model), path)
    if _is_hub_id(model):
        config_path = _hub_config(model)
        if config_path is None:
            raise ModelError(f"model: {_short(model)!r} is not in the local Hugging Face cache (the Hub is "
                             "not reached; a shipped preset or a path to a config.json works "
                             f"offline; presets: {', '.join(PRESETS)})")
        return ModelSpec(model, ModelSource.HUB_CACHE, _read_config(config_path, f"{model}'s config.json"),
                         config_path, model)
    if _looks_like_path(model):
        raise ModelError(f"model: no such file or folder: {_short(model)}")
    raise ModelError(f"model: {_short(model)!r} is not a preset ({', '.join(PRESETS)}), a path to a "
                     "config.json or a model folder, or a Hub id (org/name) in the local cache")


MAX_NAME = 1024  # characters: no preset, path or Hub id is longer
# What the prediction follows, layer by layer, before anything is built: far beyond any published
# model (the largest have under 200 layers and about 2 × 10^12 parameters), and a config past it
# is a mistake or a trace of hours.
MAX_LAYERS = 1000
MAX_PARAMETERS = 10**13
# A classifier's labels: transformers' config names every one (id2label), a second a million, so
# a count of billions is hours and gigabytes before anything is built; published heads have tens
# of thousands (ImageNet-21k's 21,843).
MAX_LABELS = 1_000_000


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def resolve(model: str) -> ModelSpec:
    """The model a run names, with its config; ModelError (one line) when it cannot be used."""
    if not isinstance(model, str) or not model.strip():
        raise ModelError("model: give a preset, a path to a config.json or a model folder, or a "
                         "Hub id")
    if len(model) > MAX_NAME:
        raise ModelError(f"model: a name of {len(model):,} characters is no preset, path or Hub "
                         f"id (at most {MAX_NAME:,})")
    path = Path(model).expanduser()
    try:
        # A file's version: rewritten within a second, it is another file (st_mtime would not tell)
        stat = path.stat() if model not in PRESETS and _exists(path) else None
        version = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        if path.is_dir() and _config_of_folder(path).is_file():
            inner = _config_of_folder(path).stat()
            version = (inner.st_mtime_ns, inner.st_size)
        spec = _resolve(model.strip(), version)
    except OSError as error:  # a part of the path too long for the file system
        raise ModelError(f"model: {error.strerror or error} ({len(model):,} characters)") from None
    check_config(spec)
    return spec


# Config entries that size a model: whole numbers (a list of them: a stage's each; null where the
# config leaves it to a default), the first ones at least 1.
_POSITIVE = ("num_hidden_layers", "num_layers", "n_layer", "hidden_size", "n_embd", "d_model",
             "num_attention_heads", "n_head", "intermediate_size", "vocab_size", "image_size",
             "patch_size", "max_position_embeddings", "n_positions", "encoder_layers",
             "decoder_layers")
_SIZES = frozenset(_POSITIVE) - {"max_position_embeddings"} | {
    "n_layers", "num_decoder_layers", "num_encoder_layers", "num_key_value_heads", "n_inner",
    "d_ff", "d_kv", "head_dim", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "num_channels", "num_labels", "num_experts",
    "num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "embed_dim", "hidden_sizes", "depths", "dim"}
# Other counts (num_*, n_*): text or a fraction there is a mistake too (transformers' own
# defaults hold some whole numbers as floats, such as 1200.0).
_COUNT = re.compile(r"^(num|n)_")
# Config keys that give a count of layers (one stack's, or an encoder's or a decoder's).
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
               "decoder_layers", "num_decoder_layers", "num_encoder_layers")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_sizes")
_FFN_KEYS = ("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
             "n_inner", "moe_intermediate_size")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _whole(value: Any) -> bool:
    if isinstance(value, list):
        return all(_whole(v) for v in value)
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _number_text(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"about 10^{len(str(abs(value))) - 1}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _largest(config: Mapping[str, Any], keys) -> int:
    values = [config.get(k) for k in keys]
    flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
    return max((v for v in flat if isinstance(v, int) and not isinstance(v, bool)), default=0)


def _layers(config: Mapping[str, Any]) -> int:
    """Layers the config builds: its layer counts (an encoder's and a decoder's together) or its
    stages' depths, and its sub-configs'."""
    own = sum(config[k] for k in LAYER_KEYS if isinstance(config.get(k), int)
              and not isinstance(config.get(k), bool))
    depths = config.get("depths")
    if not own and isinstance(depths, list):
        own = sum(d for d in depths if isinstance(d, int))
    return own + sum(_layers(v) for v in config.values() if isinstance(v, dict))


def estimated_parameters(config: Mapping[str, Any]) -> int:
    """An upper estimate of a config's parameters from its sizes alone (attention, the
    feed-forward layers of every expert, the embeddings and the output layer), with its
    sub-configs': enough to refuse an impossible config before anything is built."""
    width = _largest(config, _WIDTH_KEYS)
    ffn = max(_largest(config, _FFN_KEYS), 4 * width)
    experts = max(1, _largest(config, _EXPERT_KEYS))
    layers = _layers({k: v for k, v in config.items() if not isinstance(v, dict)})
    vocab = _largest(config, ("vocab_size",))
    own = layers * (4 * width * width + 3 * width * ffn * experts) + 2 * vocab * width
    return own + sum(estimated_parameters(v) for v in config.values() if isinstance(v, dict))


def _check_sizes(config: Mapping[str, Any], where: str, inside: str = "") -> None:
    for key, value in config.items():
        name = f"{inside}{key}"
        if isinstance(value, dict):
            if key not in ("id2label", "label2id", "rope_parameters", "rope_scaling"):
                _check_sizes(value, where, f"{name}.")
            continue
        if key in _SIZES:
            wrong = not _whole(value)
        elif _COUNT.match(key):
            wrong = isinstance(value, str) or (isinstance(value, float)
                                               and not value.is_integer())
        else:
            continue
        if wrong:
            raise ModelError(f"{where}: {name} must be a whole number, got {_number_text(value)}")
        if key in _POSITIVE and isinstance(value, int) and value < 1:
            raise ModelError(f"{where}: {name} must be a positive number, got {value}")


def check_config(spec: ModelSpec) -> None:
    """What can be told wrong from the config file alone, in one line each: before anything is
    built, so a wrong or impossible config costs nothing."""
    config, where = spec.config, f"model: {spec.display_name}"
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError(f"{where}: the config has no model_type (e.g. \"llama\", \"bert\")")
    known = known_model_types()
    if known is not None and model_type not in known:
        raise ModelError(f"{where}: transformers does not know model_type {model_type!r}")
    _check_sizes(config, where)
    layers = _layers(config)
    if layers > MAX_LAYERS:
        raise ModelError(f"{where}: {layers:,} layers are more than anatomy follows (at most "
                         f"{MAX_LAYERS:,}; published models have under 200)")
    parameters = estimated_parameters(config)
    if parameters > MAX_PARAMETERS:
        raise ModelError(f"{where}: its sizes make {_number_text(parameters)} parameters, more "
                         f"than anatomy predicts (at most 10^{len(str(MAX_PARAMETERS)) - 1})")
    heads = config.get("num_attention_heads", config.get("n_head"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if isinstance(heads, int) and isinstance(hidden, int) and heads and hidden % heads \
            and not any(k.endswith(("head_dim", "kv_channels")) for k in config):
        raise ModelError(f"{where}: hidden size {hidden} is not divisible by the "
                         f"{heads} attention heads")
    task = task_of(config)  # a head of no task anatomy trains, two towers: refused here, in a line
    labels = config.get("num_labels")
    if task in CLASSIFICATIONS and isinstance(labels, int) and not isinstance(labels, bool) \
            and not 1 <= labels <= MAX_LABELS:
        # transformers builds no classifier for 0 labels (an identity, or a layer of no outputs),
        # and the Trainer's loss needs one: a class per token, per sequence or per image.
        raise ModelError(f"{where}: num_labels must be 1 to {MAX_LABELS:,} for {task} (the "
                         f"classes its head scores), got "
                         f"{f'{labels:,}' if abs(labels) < 10**15 else _number_text(labels)}")


def check_config_class(spec: ModelSpec) -> None:
    """transformers' own checks of the config (its config class's types, values and validators),
    in one line (ModelError), before anything starts. A preset is the project's own and passes.
    transformers loads torch: in a process that has not loaded it (the run manager's, the
    dashboard's), a child interpreter builds the config class, once for each config."""
    if spec.source == ModelSource.PRESET:
        return
    import sys

    text = json.dumps(spec.config, sort_keys=True, default=str)
    if "transformers" in sys.modules:
        refusal = config_class_refusal(spec.name, text)
    else:
        refusal = _kept_refusal(spec.name, text)
    if refusal:
        raise ModelError(refusal)


CHECKS_FILE = "config-checks.json"  # in the cache folder (analysis/cache.py)
CHECKS_KEPT = 256


def _kept_refusal(name: str, config_text: str) -> str | None:
    """The child interpreter's verdict on a config (`_config_class_refusal_apart`: ~4 CPU s,
    transformers and torch loaded), kept in the cache folder: a user who starts their model's
    runs again and again (a batch size, then another) waits for it once. The key is the config,
    its name, transformers' version and this module's source."""
    folder = cache_dir()
    key = hashlib.sha256(json.dumps([name, config_text, _transformers_version()]).encode()
                         + _SOURCE_DIGEST).hexdigest()
    path = folder / CHECKS_FILE if folder is not None else None
    kept: dict = {}
    if path is not None:
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # none yet, or unreadable: made again
        kept = kept if isinstance(kept, dict) else {}
        if isinstance(kept.get(key, 0), (str, type(None))):
            return kept[key]
    refusal, known = _config_class_refusal_apart(name, config_text)
    if path is not None and known:
        kept.pop(key, None)
        kept[key] = refusal
        write_atomically(path, json.dumps(dict(list(kept.items())[-CHECKS_KEPT:])).encode())
    return refusal


def _transformers_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""


_SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).digest()


def config_class_refusal(name: str, config_text: str) -> str | None:
    """Why transformers' config class refuses the config (the JSON of a model's config.json),
    in one line; None when it takes it."""
    spec = ModelSpec(name, ModelSource.CONFIG_FILE, json.loads(config_text))
    try:
        transformers_config(spec)
        check_inputs(spec)
    except ModelError as error:
        return str(error)
    except Exception:  # noqa: BLE001 - a head class that cannot load here: the run says why
        return None
    return None


# The main inputs the dummy data makes for each task (analysis/dummy_data.py): token ids; pixel
# values or an image's pixel tokens; a source of token ids, a raw waveform or log-mel features.
MAIN_INPUTS = {IMAGE_CLASSIFICATION: ("pixel_values", "input_ids"),
               SEQ2SEQ: ("input_ids", "input_values", "input_features")}


def main_input(spec: ModelSpec) -> str:
    """What the model's head takes first, in transformers' own word (`main_input_name`). Where
    that is any "inputs": a composite model's (SpeechEncoderDecoderModel's) its encoder's, else
    the task's own (Perceiver's image classifier: pixel values). Loads transformers."""
    import transformers

    main = getattr(head_class(spec), "main_input_name", "input_ids")
    if main != "inputs":
        return main
    encoder = getattr(transformers_config(spec), "encoder", None)
    model = transformers.AutoModel._model_mapping.get(type(encoder), None) \
        if encoder is not None else None
    if model is not None:
        return getattr(model, "main_input_name", "input_ids")
    return "pixel_values" if spec.task == IMAGE_CLASSIFICATION else "input_ids"


def check_inputs(spec: ModelSpec) -> None:
    """ModelError (one line) for a head the dummy data cannot feed or the Trainer cannot train:
    one that takes no labels (PP-LCNet's classifier computes no loss), one whose main input is
    none anatomy makes, a speech encoder's features without their number of mel bins. Loads
    transformers."""
    head = head_class(spec)
    where = f"model: {spec.display_name}: {head.__name__}"
    if "labels" not in inspect.signature(head.forward).parameters:
        raise ModelError(f"{where} takes no labels: it computes no loss, and the Trainer "
                         "trains on one")
    main = main_input(spec)
    if spec.task == IMAGE_CLASSIFICATION and main == "input_ids" and "pixel_values" in \
            inspect.signature(head.forward).parameters:
        raise ModelError(f"{where} classifies an image by a text prompt (token ids first, pixel "
                         "values beside them); anatomy's dummy data for image classification "
                         "is images alone, or an image's pixel tokens")
    if main not in MAIN_INPUTS.get(spec.task, ("input_ids",)):
        raise ModelError(f"{where} takes {main} first, for {spec.task}; anatomy's dummy data "
                         f"there is {' or '.join(MAIN_INPUTS.get(spec.task, ('input_ids',)))}")
    if main == "input_features" and spec.task == SEQ2SEQ and spec.audio_features(1) is None:
        raise ModelError(f"{where} encodes speech as log-mel features, and its config names no "
                         "number of mel bins (num_mel_bins)")


@lru_cache(maxsize=64)
def _config_class_refusal_apart(name: str, config_text: str) -> tuple[str | None, bool]:
    """(the refusal or None, whether the child gave a verdict: it ran to its end)."""
    import subprocess
    import sys

    code = ("import sys; from anatomy.analysis.models import config_class_refusal as r; "
            "print(r(sys.argv[1], sys.stdin.read()) or '')")
    root = str(Path(__file__).resolve().parents[2])
    try:
        done = subprocess.run([sys.executable, "-c", code, name], input=config_text,
                              capture_output=True, text=True, timeout=300, cwd=root,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  filter(None, (root, os.environ.get("PYTHONPATH"))))})
    except (OSError, subprocess.TimeoutExpired):
        return None, False  # the run finds out itself, and fails in one line
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return (lines[-1] if lines else None), done.returncode == 0


def token_range(spec: ModelSpec, vocab: int | None = None) -> tuple[int, int]:
    """The dummy data's token ids: the walkthrough's [100, 30000), within the vocabulary (`vocab`
    where a part of the model has its own; a tiny one's start at 0)."""
    high = min(30000, vocab or spec.vocab_size or 30000)
    return (100 if high > 200 else 0), high


@dataclass(frozen=True)
class Layer:
    """A module LoRA could wrap: its dotted name, and whether it sits in an attention block."""
    name: str
    kind: str  # "linear" or "convolution"
    in_attention: bool
    grouped: bool = False  # a grouped (depthwise) convolution: peft's adapters need rank % groups

    @property
    def short(self) -> str:
        return self.name.split(".")[-1]




def _config_key(spec: ModelSpec) -> str:
    return json.dumps(spec.config, sort_keys=True, default=str)


def adaptable_layers(spec: ModelSpec) -> tuple[Layer, ...]:
    """The model's own linear and convolution layers, the task's output layer left out: what
    LoRA can wrap. Builds the model on the meta device (no memory; torch loads, once)."""
    return _modules(spec, _config_key(spec)).layers


class _Modules(NamedTuple):
    """A model's modules as LoRA sees them."""
    layers: tuple[Layer, ...]  # the adaptable layers
    # The last parts of the names of every other module (a stage called "1", a head): a LoRA
    # target that names one of those too is not a layer peft wraps.
    others: frozenset[str]
    heads: tuple[str, ...]  # the task's output layers: trained whole, never adapted
    kinds: tuple[tuple[str, str], ...]  # every other module's dotted name and class


@lru_cache(maxsize=32)
def _modules(spec: ModelSpec, config_key: str) -> _Modules:
    """The model's modules (`_Modules`), from the model built on the meta device."""
    try:
        model, _ = build_model(spec, "meta", pretrained=False)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001 - on the meta device nothing runs out of memory
        raise ModelError(f"model: transformers cannot build {spec.display_name}: "
                         f"{where_it_stopped(error)}{first_line(error)}") from None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    heads = {name for name, module in model.named_modules()
             if module is output or _is_classifier(module, spec)}
    found, others, kinds = [], set(), []
    import torch
    from transformers.pytorch_utils import Conv1D

    def kind_of(module) -> str | None:  # the layer types peft wraps (and their subclasses)
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            return "linear"
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            return "convolution"
        return None

    def walk(module, prefix: str, in_attention: bool) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            kind = kind_of(child)
            if kind is not None and full not in heads:
                found.append(Layer(full, kind, in_attention, getattr(child, "groups", 1) > 1))
            else:
                others.add(name)
                kinds.append((full, type(child).__name__))
            walk(child, f"{full}.", in_attention or "attention" in type(child).__name__.lower()
                 or "attn" in name.lower())

    walk(model, "", False)
    return _Modules(tuple(found), frozenset(others), tuple(sorted(heads)), tuple(kinds))


def _is_classifier(module, spec: ModelSpec) -> bool:
    """A classification head's output layer: it makes the labels' scores."""
    return spec.task in CLASSIFICATIONS and \
        getattr(module, "out_features", None) == spec.num_labels


def classifier_modules(spec: ModelSpec, model) -> list[str]:
    """The names of the classification head's output layers (they train beside the adapters)."""
    return [name for name, module in model.named_modules() if _is_classifier(module, spec)]


def default_lora_targets(spec: ModelSpec) -> tuple[str, ...]:
    """What LoRA wraps when the run names nothing: peft's own default for the model type where
    peft has a list of names (Gemma 4's is a pattern, which a list of targets cannot hold);
    otherwise from the model's own layers: the attention's query and value
    projections, else its fused query-key-value projection, else its attention's linear layers,
    else (a model without attention, such as a convolution network) every linear and convolution
    layer but the head's and the grouped (depthwise) convolutions, whose adapters peft limits.
    ModelError when there is nothing to wrap."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft

    if isinstance(peft.get(spec.model_type), (list, tuple, set)):  # a str is a regex: ours then
        return tuple(peft[spec.model_type])
    layers = adaptable_layers(spec)
    attention = [layer for layer in layers if layer.in_attention and layer.kind == "linear"]
    for chosen in ([layer for layer in attention if _QUERY_VALUE.match(layer.short)],
                   [layer for layer in attention if _FUSED_QKV.search(layer.short)],
                   attention, [layer for layer in layers if not layer.grouped]):
        if chosen:
            return _targets(spec, chosen, layers)
    raise ModelError(f"lora: {spec.display_name} has no linear or convolution layer for LoRA's "
                     "adapters")


def _targets(spec: ModelSpec, chosen: list[Layer], layers: tuple[Layer, ...]) -> tuple[str, ...]:
    """`_names` of the chosen layers, beside the model's other modules."""
    return _names(chosen, layers, _modules(spec, _config_key(spec)).others)


def _names(chosen: list[Layer], layers: tuple[Layer, ...], others: frozenset[str]
           ) -> tuple[str, ...]:
    """The chosen layers as peft's targets: their short names where those name nothing else (no
    other layer, no other module: peft would wrap ConvNeXt's stage "1" beside its layer "1"),
    else their dotted names."""
    names = set(layer.name for layer in chosen)
    short = {layer.short for layer in chosen}
    if all(layer.name in names for layer in layers if layer.short in short) and \
            not short & others:
        return tuple(sorted(short))
    return tuple(sorted(names))


def unknown_lora_targets(spec: ModelSpec, targets: tuple[str, ...]) -> list[str]:
    """Targets that match none of the model's linear or convolution layers, as peft matches them
    (the module's dotted name, or its end after a dot)."""
    names = [layer.name for layer in adaptable_layers(spec)]
    return [t for t in targets if t != ALL_LINEAR
            and not any(name == t or name.endswith(f".{t}") for name in names)]


def unknown_target_words(spec: ModelSpec, target: str) -> str:
    """What a LoRA target that is none of the adaptable layers names instead, in words: the
    task's output layer, another kind of module, or nothing."""
    modules = _modules(spec, _config_key(spec))

    def named(name: str) -> bool:  # as peft matches a target
        return name == target or name.endswith(f".{target}")

    head = next((name for name in modules.heads if named(name)), None)
    if head is not None:
        return (f"{target} is the output layer of {spec.display_name}'s head ({head}), which "
                "trains whole beside the adapters, never adapted")
    other = next(((name, kind) for name, kind in modules.kinds if named(name)), None)
    if other is not None:
        return (f"{target} names {other[0]} of {spec.display_name}, a {other[1]}: no linear or "
                "convolution layer")
    return f"{target} names no module of {spec.display_name}"


def linear_module_names(spec: ModelSpec) -> tuple[str, ...]:
    """The short names of the model's layers LoRA can wrap, for a message."""
    return tuple(dict.fromkeys(layer.short for layer in adaptable_layers(spec)))


def lora_target_modules(spec: ModelSpec, chosen: tuple[str, ...] = ()) -> str | tuple[str, ...]:
    """peft's `target_modules`: the chosen modules, else `default_lora_targets`; `ALL_LINEAR`
    handed to peft as it is, for peft's own rule. anatomy's reading of it (every nn.Linear but
    the output layer and a classifier's) missed what peft adds: the routers and experts of a
    mixture of experts, which transformers 5 made no nn.Linear (GLM-4 MoE, DeepSeek-V3), and
    keeps: a classifier that is none of peft's head names (Flaubert's sequence_summary)."""
    if chosen == (ALL_LINEAR,):
        return ALL_LINEAR
    return chosen or default_lora_targets(spec)


def supports_checkpointing(spec: ModelSpec) -> bool:
    """Whether the model can recompute its activations (transformers'
    `supports_gradient_checkpointing`; ResNet, ALBERT, MPNet cannot). Loads transformers."""
    return _supports_checkpointing(spec, _config_key(spec))


@lru_cache(maxsize=64)
def _supports_checkpointing(spec: ModelSpec, config_key: str) -> bool:
    try:
        head = head_class(spec)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001 - a class that cannot be loaded here
        raise ModelError(f"model: transformers cannot load {spec.head or spec.model_type}: "
                         f"{first_line(error)}") from None
    return bool(getattr(head, "supports_gradient_checkpointing", False))


# What a config.json says of the machine or the training that saved it, not of the model: its
# dtype (the Trainer keeps fp32 weights and autocasts), its attention implementation
# (flash_attention_2 needs its package where the model is built; transformers' own choice, sdpa,
# runs the same flash algorithm on a GPU), and checkpointing, which the run's option decides
# (transformers turns an old config's "gradient_checkpointing": true on at build time).
_MACHINE_KEYS = ("model_type", "transformers_version", "torch_dtype", "dtype",
                 "attn_implementation", "_attn_implementation", "_attn_implementation_autoset",
                 "gradient_checkpointing")


def transformers_config(spec: ModelSpec):
    """The transformers config object for the model's task head."""
    from transformers import AutoConfig, PretrainedConfig

    # A float JSON cannot hold (Mamba-2's time_step_limit reaches infinity) is written by
    # save_pretrained as {"__float__": "Infinity"}, and read back by from_pretrained's decoder
    values = PretrainedConfig._decode_special_floats(
        {k: v for k, v in spec.config.items() if k not in _MACHINE_KEYS})
    values["num_labels"] = spec.num_labels
    values.pop("id2label", None) if spec.task != IMAGE_CLASSIFICATION else None
    values.pop("label2id", None) if spec.task != IMAGE_CLASSIFICATION else None
    try:
        config = AutoConfig.for_model(spec.model_type, **values)
    except Exception as error:  # noqa: BLE001 - the config class's own checks, in one line
        raise ModelError(f"model: {spec.display_name}: transformers refuses the config: "
                         f"{first_line(error)}") from None
    languages = getattr(config, "languages", None)
    if getattr(config, "default_language", False) is None and languages:
        # X-MOD's adapters need the language of inputs that name none: the config's first.
        config.default_language = list(languages)[0]
    if spec.task == SEQUENCE_CLASSIFICATION and getattr(config, "pad_token_id", None) is None:
        # A decoder's classification head finds each sequence's last token by its padding id.
        # Llama 3.1 and others name several end tokens: the first.
        end = getattr(config, "eos_token_id", None)
        end = end[0] if isinstance(end, (list, tuple)) and end else end
        config.pad_token_id = end if isinstance(end, int) else 0
    return config


_AUTO_CLASSES = {SEQUENCE_CLASSIFICATION: ("AutoModelForSequenceClassification",),
                 CAUSAL_LM: ("AutoModelForCausalLM",),
                 IMAGE_CLASSIFICATION: ("AutoModelForImageClassification",),
                 SEQ2SEQ: ("AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq"),
                 TOKEN_CLASSIFICATION: ("AutoModelForTokenClassification",)}


def head_class(spec: ModelSpec):
    """The model class that trains: the head transformers' tables name for the config, else the
    task's Auto class's choice."""
    import transformers

    if spec.head is not None and hasattr(transformers, spec.head):
        return getattr(transformers, spec.head)
    config = transformers_config(spec)
    for name in _AUTO_CLASSES[spec.task]:
        mapping = getattr(transformers, name)._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise ModelError(f"model: transformers has no {spec.task} head for "
                     f"{type(config).__name__} ({spec.display_name})")


def head_config(head, config):
    """The config `head` takes: a composite config's part of the head's own config class (Llama
    4's and Emu3's causal LMs take the text part, as transformers' Auto classes give it; MusicGen's
    its decoder's); the task's settings (labels, padding id) go with it."""
    wanted = getattr(head, "config_class", None)
    part = next((key for key, kind in getattr(config, "sub_configs", {}).items()
                 if kind is wanted and wanted is not type(config)), None)
    inner = getattr(config, part, None) if part else None
    if inner is None or type(inner) is not wanted:
        return config
    inner.num_labels = config.num_labels
    if getattr(inner, "pad_token_id", None) is None:
        inner.pad_token_id = getattr(config, "pad_token_id", None)
    return inner


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
    head = head_class(spec)
    config = head_config(head, transformers_config(spec))
    source = RANDOM_WEIGHTS
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
            model = head._from_config(config, dtype=torch.float32)
    if lora_rank:
        model = apply_lora(model, spec, lora_rank, lora_targets)
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
                for adapter in module.lora_A:
                    module.reset_lora_parameters(
                        adapter, model.peft_config[adapter].init_lora_weights)


def apply_lora(model, spec: ModelSpec, rank: int, targets: tuple[str, ...] = ()):
    """peft's LoRA on the model: adapters of rank `rank` on the target modules, everything else
    frozen; for classification the head, which the task adds, trains as well."""
    from peft import LoraConfig, TaskType, get_peft_model

    task_type = {SEQUENCE_CLASSIFICATION: TaskType.SEQ_CLS, CAUSAL_LM: TaskType.CAUSAL_LM,
                 SEQ2SEQ: TaskType.SEQ_2_SEQ_LM,
                 TOKEN_CLASSIFICATION: TaskType.TOKEN_CLS}.get(spec.task)
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        task_type = None  # peft's seq2seq wrapper passes token ids, not audio: no task
    modules = lora_target_modules(spec, targets)
    # peft's all-linear leaves out the output embeddings and a sequence classifier's head, not a
    # token classifier's, which TOKEN_CLS saves whole: it would be wrapped too, and peft refuses
    # ("modules_to_save cannot be applied to modules of type Linear").
    kept_out = classifier_modules(spec, model) \
        if modules == ALL_LINEAR and spec.task == TOKEN_CLASSIFICATION else None
    config = LoraConfig(r=rank, target_modules=modules if isinstance(modules, str) else list(modules),
                        task_type=task_type, exclude_modules=kept_out or None,
                        modules_to_save=classifier_modules(spec, model)
                        if spec.task == IMAGE_CLASSIFICATION else None)
    try:
        with warnings.catch_warnings():
            # peft reads the model's is_gradient_checkpointing, which transformers 5 deprecates:
            # a FutureWarning on every LoRA run about a call neither the user nor anatomy makes.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                    FutureWarning)
            return get_peft_model(model, config)
    except ValueError as error:
        # peft names a module it cannot wrap by its whole repr, many lines: its class is enough.
        text = re.sub(r"(\w+)\(\n.*?\n\)", r"\1", str(error), count=1, flags=re.DOTALL)
        raise ModelError(f"lora_targets: {first_line(ValueError(text))}") from None

