"""anatomy: GPU memory during model training, measured phase by phase.

The package is laid out by its seams (docs/ARCHITECTURE.md): `store` (SQLite, typed rows),
`analysis` (options, models, reports, components), `prediction` (memory before a run), `engine`
(the processes of a run), `views` (what each page shows, and its figures), `cli`, and `dashboard`
(the Streamlit app, the only part that imports Streamlit). Importing the package itself imports
neither torch nor transformers: the worker's baseline phase must begin before torch is loaded.
"""

__version__ = "0.1.0"

# The API for the user's own training, loaded on first use: `import anatomy` stays free of torch.
_EXPORTS = {
    "start": "anatomy.engine.attach",
    "current": "anatomy.engine.attach",
    "Run": "anatomy.engine.attach",
    "AnatomyCallback": "anatomy.engine.callbacks",
}
__all__ = ["AnatomyCallback", "Run", "current", "start"]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'anatomy' has no attribute {name!r}")
