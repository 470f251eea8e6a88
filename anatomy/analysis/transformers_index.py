"""transformers' index of its model folders, made once per installation instead of twice a
process.

`import transformers` reads every file of its ~550 model folders to index what each exports
(half a second of CPU), and the first import of `transformers.models` (any model, config or
Trainer) reads them all again, because the cache that should answer it keeps only 128 folders.
`index_once()` keeps the first index in anatomy's cache folder (analysis/cache.py), made again
when transformers' version, place or any file of its model folders changes, and lets the second
come from the first (the same entries, without the top package's prefix): every process that
trains or predicts reads one file instead of 3,000. tests/unit/test_models.py holds the indexes
equal to transformers' own; where transformers no longer makes them as this expects (another
version), they are made as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import wraps
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import PathFinder
from pathlib import Path

from anatomy.analysis.cache import cache_dir, write_atomically

PREFIX = "models"
INDEX_FILE = "transformers-index.json"
IMPORT_UTILS = "transformers.utils.import_utils"


def index_once() -> None:
    """From now on in this process, before transformers is first imported (this imports
    nothing: torch and transformers load when something needs them)."""
    if "transformers.models" not in sys.modules and \
            not any(isinstance(f, _Indexes) for f in sys.meta_path):
        sys.meta_path.insert(0, _Indexes())


class _Indexes(MetaPathFinder):
    """Asked first for every import. transformers' import utilities get their index from the
    disk; at transformers.models (its parent package imported, with the first index), it hands
    the package's index over and steps aside."""

    def find_spec(self, fullname, path, target=None):
        if fullname == IMPORT_UTILS:
            spec = PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenIndexed(spec.loader)
                return spec
        elif fullname == f"transformers.{PREFIX}":
            sys.meta_path.remove(self)
            if IMPORT_UTILS in sys.modules:  # transformers was imported before index_once
                _index_models(sys.modules[IMPORT_UTILS])
        return None  # the import itself goes on as ever


class _ThenIndexed(Loader):
    """transformers' own loader of its import utilities, their index function wrapped once the
    module is made (before `transformers/__init__.py` takes it)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _index_models(module)

    def __getattr__(self, name):  # get_source, get_filename…: the loader's own
        return getattr(self.loader, name)


def _index_models(import_utils) -> None:
    define = getattr(import_utils, "define_import_structure", None)
    if define is None or getattr(define, "_anatomy", False):
        return
    models = Path(import_utils.__file__).parent.parent / PREFIX
    made: dict = {}

    @wraps(define)
    def define_import_structure(module_path, prefix=None):
        if prefix == PREFIX and Path(module_path) == models:
            if "top" not in made:
                made["top"] = stored_index(define, models)
            return made["top"]
        if prefix is None and Path(module_path) == models / "__init__.py":
            return models_index(define_import_structure, models)
        return define(module_path, prefix)

    define_import_structure._anatomy = True
    import_utils.define_import_structure = define_import_structure


def models_index(define, models: Path) -> dict:
    """The models package's index from the top package's (`define`: the index function that
    answers transformers/__init__.py's own call; `models`: the package's folder)."""
    top = define(models, prefix=PREFIX)
    start = len(PREFIX) + 1
    return {backends: {name[start:]: set(objects) for name, objects in modules.items()
                       if name.startswith(f"{PREFIX}.")}
            for backends, modules in top.items()}


def stored_index(define, models: Path) -> dict:
    """transformers' index of `models` (prefixed), from the cache folder when it was made of the
    same files, else made by `define` and stored."""
    folder = cache_dir()
    key = _fingerprint(models)
    path = folder / INDEX_FILE if folder is not None else None
    if path is not None and key is not None:
        try:
            stored = json.loads(path.read_text())
            if stored["key"] == key:
                return {frozenset(backends): {name: set(objects)
                                              for name, objects in modules.items()}
                        for backends, modules in stored["index"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or unreadable: made again
    index = define(models, prefix=PREFIX)
    if path is not None and key is not None:
        _store(path, key, index)
    return index


def _fingerprint(models: Path) -> list | None:
    """What the index is made of: transformers' place, and each file's name, size and time
    under its model folders (~3,000 files: 15 ms). None where the folder cannot be read."""
    files = []
    try:
        for root, folders, names in os.walk(models):
            folders.sort()
            for name in sorted(names):
                if name.endswith(".py"):
                    status = os.stat(os.path.join(root, name))
                    files.append((os.path.relpath(os.path.join(root, name), models),
                                  status.st_size, status.st_mtime_ns))
    except OSError:
        return None
    digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    return [str(models), len(files), digest]


def _store(path: Path, key: list, index: dict) -> None:
    try:
        entries = [[sorted(backends), {name: sorted(objects) for name, objects in modules.items()}]
                   for backends, modules in index.items()]
        text = json.dumps({"key": key, "index": entries})
    except TypeError:
        return  # an index of other than names: not kept
    write_atomically(path, text.encode())
