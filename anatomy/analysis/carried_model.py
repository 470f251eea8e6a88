"""The model a run carries: what every front that records a model keeps of it in the run's facts
(`RunFacts.model_config`, `model_path`), and the model folder every reader predicts from.

A run names its model as the user gave it ("mine.json", a folder's name): a path relative to
where it started, to a file that may be moved, edited or deleted, on a machine an export leaves
behind. So the config itself travels with the run — anatomy's own runs keep the file's config as
it was read when they started, a user's Trainer (the callback) the config as transformers wrote
it — and the Anatomy page predicts from that copy in any directory, on any machine. A preset's
name is enough: its config ships with anatomy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anatomy.analysis.cache import cache_dir, write_atomically
from anatomy.analysis.models import ModelSpec
from anatomy.store import RunFacts
from anatomy.vocabulary import ModelSource

# A model from the user's files, which may be gone since the run (a stored run's model_source).
FILES = (ModelSource.CONFIG_FILE, ModelSource.MODEL_FOLDER)


def kept(spec: ModelSpec) -> RunFacts:
    """What a run of anatomy's keeps of the model it names, written as it starts (a run that
    fails before its model is built keeps it too): a config file's, a model folder's or a cached
    Hub id's config as it was read, and where the file or folder was."""
    facts: dict[str, Any] = {"model": spec.display_name, "model_source": spec.source}
    if spec.source != ModelSource.PRESET:
        path = local_path(spec.name)
        facts.update({"model_path": path} if path else {}, model_config=dict(spec.config))
    return RunFacts.of(**facts)


def trained(config: Any, class_name: str, architecture: str | None = None) -> RunFacts:
    """What a run keeps of the model a user's Trainer trains (the callback): its class, its name
    (transformers' `name_or_path`) and, where that is a folder here, the folder; its config as
    transformers writes it, with the class trained as its architecture, as save_pretrained
    writes it (the head a prediction builds): `architecture`, transformers' class that the
    user's is or derives from, else the class itself where the config names none. The config
    a model was loaded with names the checkpoint's head, not the one trained: a classifier
    loaded from a causal LM's checkpoint (`AutoModelForSequenceClassification` of a Llama) says
    LlamaForCausalLM."""
    name = getattr(config, "name_or_path", None) or None
    facts: dict[str, Any] = {"model_class": class_name, "model_name": name or class_name}
    path = local_path(name)
    if path:
        facts["model_path"] = path
    if config is not None:
        model_config = json.loads(config.to_json_string())
        if architecture is not None or not model_config.get("architectures"):
            model_config["architectures"] = [architecture or class_name]
        facts["model_config"] = model_config
    return RunFacts.of(**facts)


def local_path(name: str | None) -> str | None:
    """`name` as an absolute path where it is a file or folder here (a relative one names nothing
    once the run is read from elsewhere); None for anything else (a Hub id, a class name)."""
    if not name:
        return None
    path = os.path.expanduser(name)
    try:
        return os.path.abspath(path) if os.path.exists(path) else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return None


@contextmanager
def model_folder(config: Mapping[str, Any], name: str) -> Iterator[str]:
    """A model folder holding `config`, as `models.resolve` reads one, named `name` (what a title
    or a refusal calls the model): in the cache folder by its content, so that the same run read
    again is the same folder (its prediction comes from memory), else a temporary folder while
    the block lasts."""
    text = json.dumps(config, indent=2)
    folder_name = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "model"
    cache = cache_dir()
    if cache is not None:
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        path = cache / "models" / digest / folder_name / "config.json"
        if _holds(path, text) or write_atomically(path, text.encode()):
            yield str(path.parent)
            return
    with tempfile.TemporaryDirectory(prefix="anatomy-model-") as temporary:
        path = Path(temporary) / folder_name / "config.json"
        path.parent.mkdir()
        path.write_text(text)
        yield str(path.parent)


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text() == text
    except (OSError, UnicodeDecodeError):
        return False
