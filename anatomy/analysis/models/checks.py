"""A config checked before anything starts, each fault in one line: its sizes and counts, and
transformers' own config class, which needs transformers and so, in a process that has not
loaded it, a child interpreter (its verdict kept in the cache folder).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from anatomy.analysis.cache import cache_dir, write_atomically
from anatomy.analysis.models.classes import (
    MAIN_INPUTS,
    head_class,
    head_config,
    main_input,
    transformers_config,
)
from anatomy.analysis.models.errors import ModelError, cannot_build
from anatomy.analysis.models.heads import known_model_types, task_of
from anatomy.analysis.models.spec import ModelSpec
from anatomy.analysis.models.tasks import CLASSIFICATIONS, IMAGE_CLASSIFICATION, SEQ2SEQ
from anatomy.vocabulary import ModelSource

# What the prediction follows, layer by layer, before anything is built: far beyond any published
# model (the largest have under 200 layers and about 2 × 10^12 parameters), and a config past it
# is a mistake or a trace of hours.
MAX_LAYERS = 1000
MAX_PARAMETERS = 10**13
# A classifier's labels: transformers' config names every one (id2label), a second a million, so
# a count of billions is hours and gigabytes before anything is built; published heads have tens
# of thousands (ImageNet-21k's 21,843).
MAX_LABELS = 1_000_000

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


def number_text(value: Any) -> str:
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
            raise ModelError(f"{where}: {name} must be a whole number, got {number_text(value)}")
        if key in _POSITIVE and isinstance(value, int) and value < 1:
            raise ModelError(f"{where}: {name} must be a positive number, got {value}")


def quantization_left_out(config: Mapping[str, Any]) -> str | None:
    """What a config's quantization_config is, said as left out ("its quantization_config
    (bitsandbytes, 4-bit) is left out: the weights are unquantized"), or None. `from_pretrained`
    quantizes the weights as it loads them; anatomy builds them from the config (random weights,
    as much memory as pretrained ones) unquantized, trains and predicts them so. Not refused:
    published configs carry one (gpt-oss's mxfp4) where the unquantized model is what is run."""
    quantization = config.get("quantization_config")
    if not quantization:
        return None
    method = (str(quantization.get("quant_method") or "an unnamed method")
              if isinstance(quantization, Mapping) else "an unnamed method")
    bits = (("4" if quantization.get("load_in_4bit") else "8" if quantization.get("load_in_8bit")
             else quantization.get("bits")) if isinstance(quantization, Mapping) else None)
    how = f"{method}, {bits}-bit" if str(bits).isdigit() else method
    return f"its quantization_config ({how}) is left out: the weights are unquantized"


def check_config(spec: ModelSpec) -> None:
    """What can be told wrong from the config file alone, in one line each: before anything is
    built, so a wrong or impossible config costs nothing."""
    config, where = spec.config, f"model: {spec.display_name}"
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError(f"{where}: the config has no model_type (e.g. \"llama\", \"bert\")")
    known = known_model_types()
    if known is not None and model_type not in known:
        remote = (": its config's auto_map names the model's own code, which anatomy does not "
                  "run (trust_remote_code); transformers' own architectures build"
                  if isinstance(config.get("auto_map"), Mapping) else "")
        raise ModelError(f"{where}: transformers does not know model_type {model_type!r}{remote}")
    _check_sizes(config, where)
    layers = _layers(config)
    if layers > MAX_LAYERS:
        raise ModelError(f"{where}: {layers:,} layers are more than anatomy follows (at most "
                         f"{MAX_LAYERS:,}; published models have under 200)")
    parameters = estimated_parameters(config)
    if parameters > MAX_PARAMETERS:
        raise ModelError(f"{where}: its sizes make {number_text(parameters)} parameters, more "
                         f"than anatomy predicts (at most 10^{len(str(MAX_PARAMETERS)) - 1})")
    heads = config.get("num_attention_heads", config.get("n_head"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if isinstance(heads, int) and isinstance(hidden, int) and heads and hidden % heads \
            and not any(k.endswith(("head_dim", "kv_channels")) for k in config):
        raise ModelError(f"{where}: hidden size {hidden} is not divisible by the "
                         f"{heads} attention heads")
    for inside, part in [("", config), *((f"{k}.", v) for k, v in config.items()
                                         if isinstance(v, Mapping))]:
        # grouped-query attention shares each key-value head among a whole number of query
        # heads: a config class's default left in (Qwen2's 32 under 4 heads) stopped the
        # forward pass ("The size of tensor a (4) must match the size of tensor b (32)")
        queries, keys = part.get("num_attention_heads"), part.get("num_key_value_heads")
        if isinstance(queries, int) and isinstance(keys, int) and keys > 0 and queries % keys:
            raise ModelError(f"{where}: {inside}num_attention_heads {queries} is not divisible "
                             f"by {inside}num_key_value_heads {keys} (each key-value head "
                             "serves a whole number of query heads: set num_key_value_heads to a "
                             f"divisor of {queries})")
    task = task_of(config)  # a head of no task anatomy trains, two towers: refused here, in a line
    labels = config.get("num_labels")
    if task in CLASSIFICATIONS and isinstance(labels, int) and not isinstance(labels, bool) \
            and not 1 <= labels <= MAX_LABELS:
        # transformers builds no classifier for 0 labels (an identity, or a layer of no outputs),
        # and the Trainer's loss needs one: a class per token, per sequence or per image.
        raise ModelError(f"{where}: num_labels must be 1 to {MAX_LABELS:,} for {task} (the "
                         f"classes its head scores), got "
                         f"{f'{labels:,}' if abs(labels) < 10**15 else number_text(labels)}")


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


# The verdict follows the checks and the head classes they build: every module here.
_SOURCE_DIGEST = hashlib.sha256(b"".join(
    path.read_bytes() for path in sorted(Path(__file__).parent.glob("*.py")))).digest()


def config_class_refusal(name: str, config_text: str) -> str | None:
    """Why transformers' config class refuses the config (the JSON of a model's config.json),
    in one line; None when it takes it."""
    spec = ModelSpec(name, ModelSource.CONFIG_FILE, json.loads(config_text))
    try:
        transformers_config(spec)
        check_inputs(spec)
        _build_on_meta(spec)
    except ModelError as error:
        return str(error)
    except Exception:  # noqa: BLE001 - a head class that cannot load here: the run says why
        return None
    return None


def _build_on_meta(spec: ModelSpec) -> None:
    """The head built on the meta device (no memory; a second or so): a head whose construction
    needs a library this machine lacks (transformers' `requires_backends`: natten, timm,
    detectron2) is refused here, in the line its run would fail with, instead of a run started
    to fail. Other errors of a meta build are left to the run: a model may read values while it
    builds, which the meta device has none of."""
    import torch

    head = head_class(spec)
    try:
        with torch.device("meta"):
            head._from_config(head_config(head, transformers_config(spec)))
    except ImportError as error:
        raise cannot_build(spec.display_name, error) from None


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

    code = ("import sys; from anatomy.analysis.models.checks import config_class_refusal as r; "
            "print(r(sys.argv[1], sys.stdin.read()) or '')")
    root = str(Path(__file__).resolve().parents[3])
    try:
        done = subprocess.run([sys.executable, "-c", code, name], input=config_text,
                              capture_output=True, text=True, timeout=300, cwd=root,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  filter(None, (root, os.environ.get("PYTHONPATH"))))})
    except (OSError, subprocess.TimeoutExpired):
        return None, False  # the run finds out itself, and fails in one line
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return (lines[-1] if lines else None), done.returncode == 0
