"""transformers' index of its model folders, made once per process instead of twice.

`import transformers` reads every file of its ~550 model folders to index what each exports; the
first import of `transformers.models` (any model, config or Trainer) reads them all again,
because the cache that should answer it keeps only 128 folders: a third of a second of CPU, in
every process that trains or predicts. `index_once()` lets the second index come from the first
(the same entries, without the top package's prefix). tests/unit/test_models.py holds the two
equal; where transformers' cache no longer holds the first (another version), the index is made
once more, as before.
"""

from __future__ import annotations

import sys
from functools import wraps
from importlib.abc import MetaPathFinder
from pathlib import Path

PREFIX = "models"


def index_once() -> None:
    """From now on in this process, before transformers' models package is first imported (this
    imports nothing: torch and transformers load when something needs them)."""
    if "transformers.models" not in sys.modules and \
            not any(isinstance(f, _BeforeModels) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeModels())


class _BeforeModels(MetaPathFinder):
    """Asked first for every import; at transformers.models (its parent package imported, with
    the first index), it hands the package's index over and steps aside."""

    def find_spec(self, fullname, path, target=None):
        if fullname == f"transformers.{PREFIX}":
            sys.meta_path.remove(self)
            _reuse_the_top_index()
        return None  # the import itself goes on as ever


def _reuse_the_top_index() -> None:
    import transformers
    from transformers.utils import import_utils

    define = import_utils.define_import_structure
    models = Path(transformers.__file__).parent / PREFIX

    @wraps(define)
    def define_import_structure(module_path, prefix=None):
        if prefix is None and Path(module_path) == models / "__init__.py":
            return models_index(define, models)
        return define(module_path, prefix)

    import_utils.define_import_structure = define_import_structure


def models_index(define, models: Path) -> dict:
    """The models package's index from the top package's (`define`: transformers' cached
    `define_import_structure`; `models`: the package's folder)."""
    top = define(models, prefix=PREFIX)  # transformers/__init__.py's own call, as it makes it
    start = len(PREFIX) + 1
    return {backends: {name[start:]: set(objects) for name, objects in modules.items()
                       if name.startswith(f"{PREFIX}.")}
            for backends, modules in top.items()}
