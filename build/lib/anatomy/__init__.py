"""anatomy: GPU memory during model training, measured phase by phase.

The package is laid out by its seams (docs/ARCHITECTURE.md): `store` (SQLite, typed rows),
`analysis` (options, models, reports, components, prediction), `engine` (the processes of a run),
`views` (figures and page logic), `cli`. Nothing here imports Streamlit (the dashboard imports
this package), and importing the package itself imports neither torch nor transformers: the
worker's baseline phase must begin before torch is loaded.
"""

__version__ = "0.1.0"
