"""Following a training step's tensors without their memory: the live-tensor tracker, the CUDA
kernels that a CPU machine does not have, and the Trainer's step, run on fake tensors.

The one package outside the engine that imports torch when it is imported: the prediction
(prediction/memory.py) imports it inside the functions that trace, so the CLI, the
pages and the worker's baseline still load without torch (pyproject.toml's contract says so).
"""
