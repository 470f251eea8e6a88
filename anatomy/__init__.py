"""anatomy: GPU memory during model training, measured phase by phase.

The engine: options, presets, the NVML wrapper, the sampler and worker processes, the run store
and the run manager. Nothing here imports Streamlit (the dashboard imports this package), and
importing the package itself imports neither torch nor transformers: the worker's baseline phase
must begin before torch is loaded.
"""

__version__ = "0.1.0"
