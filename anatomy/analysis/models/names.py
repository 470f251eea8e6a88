"""A name resolved to its model: a preset, a config.json or a model folder, a Hub id in the local
cache; checked (`checks.check_config`) before it is given back.
"""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache
from pathlib import Path

from anatomy.analysis.models.checks import check_config, quantization_left_out
from anatomy.analysis.models.errors import ModelError
from anatomy.analysis.models.spec import (
    HUB_FOLDER,
    PRESETS,
    ModelSpec,
    is_hub_id,
    looks_like_path,
    path_exists,
)
from anatomy.units import mib_text
from anatomy.vocabulary import ModelSource


def _config_of_folder(folder: Path) -> Path:
    """The config.json of a model folder: its own, else (a model's folder in the local Hub
    cache) its main revision's."""
    own = folder / "config.json"
    if own.is_file() or not HUB_FOLDER.fullmatch(folder.name):
        return own
    try:
        revision = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return own
    return folder / "snapshots" / revision / "config.json"


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


def short(text: str) -> str:
    """A name as a message quotes it: its first and last characters when it is long, and a
    control character as its escape (a path's ESC would colour the user's terminal)."""
    text = "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)
    return text if len(text) <= 80 else f"{text[:40]}…{text[-30:]}"


def _hub_config(model_id: str) -> Path | None:
    """The config.json of a Hub id in the local cache (HF_HOME / HF_HUB_CACHE), or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except ValueError:  # no Hub id after all (huggingface_hub's own rules: length, characters)
        return None
    return Path(found) if isinstance(found, str) else None


ADAPTER_CONFIG = "adapter_config.json"  # what peft's save_pretrained writes of an adapter


def _adapter_words(folder: Path, model: str) -> str | None:
    """What a folder of PEFT adapters (no model of its own) is, and the options that train its
    base model with such adapters; None for any other folder."""
    try:
        adapter = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(adapter, dict):
        return None
    base = adapter.get("base_model_name_or_path")
    kind, rank = adapter.get("peft_type"), adapter.get("r")
    targets = adapter.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    said = f"model: {short(model)} is a PEFT adapter, not a model"
    if kind != "LORA" or not isinstance(rank, int) or not isinstance(targets, list) \
            or not all(isinstance(t, str) for t in targets):
        return (f"{said} ({kind or 'of an unnamed type'}"
                + (f", of {short(str(base))}" if base else "")
                + "): anatomy trains a model's LoRA adapters (--lora-rank) or every weight")
    options = f"--lora-rank {rank} --lora-targets {' '.join(sorted(targets))}"
    if not base:
        return f"{said}: name its base model (its config names none) with {options}"
    return f"{said}: name its base model with its adapters (--model {short(str(base))} {options})"


def is_preset(model: str) -> bool:
    """Whether `model` names a shipped preset: its name, and no config file or model folder of
    that name here (one is that file, as transformers' `from_pretrained("gpt2")` reads a folder
    ./gpt2 before the Hub's)."""
    if model not in PRESETS:
        return False
    path = Path(model)
    try:
        return not (path.is_file() or (path.is_dir() and _config_of_folder(path).is_file()))
    except OSError:
        return True


@lru_cache(maxsize=256)
def _resolve(model: str, version: tuple[int, int] | None) -> ModelSpec:
    if is_preset(model):
        preset = PRESETS[model]
        return ModelSpec(model, ModelSource.PRESET, preset.config_dict(), preset.config_path, preset.hub_id)
    path = Path(model).expanduser()
    if path.is_dir():
        config_path = _config_of_folder(path)
        if not config_path.is_file():
            raise ModelError(_adapter_words(path, model)
                             or f"model: the folder {short(model)} has no config.json")
        return ModelSpec(model, ModelSource.MODEL_FOLDER, _read_config(config_path, f"{model}/config.json"),
                         config_path)
    if path.is_file():
        return ModelSpec(model, ModelSource.CONFIG_FILE, _read_config(path, model), path)
    if is_hub_id(model):
        config_path = _hub_config(model)
        if config_path is None:
            raise ModelError(f"model: {short(model)!r} is not in the local Hugging Face cache (the Hub is "
                             "not reached; a shipped preset or a path to a config.json works "
                             f"offline; presets: {', '.join(PRESETS)})")
        return ModelSpec(model, ModelSource.HUB_CACHE, _read_config(config_path, f"{model}'s config.json"),
                         config_path, model)
    if looks_like_path(model):
        raise ModelError(f"model: no such file or folder: {short(model)}")
    raise ModelError(f"model: {short(model)!r} is not a preset ({', '.join(PRESETS)}), a path to a "
                     "config.json or a model folder, or a Hub id (org/name) in the local cache")


MAX_NAME = 1024  # characters: no preset, path or Hub id is longer


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
        # A file's version: rewritten within a second, it is another file (st_mtime would not
        # tell).
        stat = path.stat() if not is_preset(model) and path_exists(path) else None
        version = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        if path.is_dir() and _config_of_folder(path).is_file():
            inner = _config_of_folder(path).stat()
            version = (inner.st_mtime_ns, inner.st_size)
        spec = _resolve(model.strip(), version)
    except OSError as error:  # a part of the path too long for the file system
        raise ModelError(f"model: {error.strerror or error} ({len(model):,} characters)") from None
    check_config(spec)
    return spec


def named_quantization(model: str) -> str | None:
    """`quantization_left_out` of the model a run names; None where it has none, or where it
    cannot be resolved any more (its file gone since its options were judged: the run or the
    prediction says so itself)."""
    try:
        return quantization_left_out(resolve(model).config)
    except ModelError:
        return None


def own_tokenizer(model: str) -> str | None:
    """The folder of the tokenizer saved beside a model's config (a model folder as
    `save_pretrained` of a model and its tokenizer writes it, a Hub snapshot in the local cache),
    as transformers' `AutoTokenizer.from_pretrained(model)` would read it; None for a preset, a
    folder without a tokenizer.json, or a name that resolves to nothing."""
    try:
        spec = resolve(model)
    except ModelError:
        return None
    if spec.source == ModelSource.PRESET or spec.config_path is None:
        return None
    folder = spec.config_path.parent
    return str(folder) if (folder / "tokenizer.json").is_file() else None
