"""Training memory predicted before anything runs, for any model: the training step's operators
followed on fake tensors (`tracing/`), laid out step by step (`replay`), through PyTorch's caching
allocator simulated (`allocator`), with the device's calibrated constants (`device_constants`,
`calibration/<gpu>.json`); `memory` reads the components, the peaks, each rank's share and the
largest batch from that. docs/PREDICTION.md states every modelled effect and constant.

Its one entry is `answer(Request(options, target(...)))`: a request (the run's options, the device
from `target`, the one resolver of "which device, how much of it") in, the prediction out, part by
part. What readers use is named here. Importing the package imports no torch: the tracing does, inside
the functions that predict.
"""

from anatomy.prediction.memory import (
    COMPONENTS,
    CPU_PROCESS,
    DEVICES,
    WALKTHROUGH_BYTES_PER_PARAMETER,
    BatchFit,
    BatchSizes,
    Prediction,
    PredictionError,
    RankPrediction,
    calibration_for,
    capacity_for,
    max_batch_size,
    measured_recording,
    predict,
    predict_ranks,
    rank_prediction,
    steps_measured,
    walkthrough_bytes_per_parameter,
)
from anatomy.prediction.request import Answer, Request, answer
from anatomy.prediction.target import Target, ran_on, target

__all__ = [
    "Answer", "Request", "Target", "answer", "ran_on", "target",
    "COMPONENTS", "CPU_PROCESS", "DEVICES",
    "WALKTHROUGH_BYTES_PER_PARAMETER", "BatchFit", "BatchSizes", "Prediction", "PredictionError",
    "RankPrediction", "calibration_for", "capacity_for", "max_batch_size", "measured_recording",
    "predict",
    "predict_ranks", "rank_prediction", "steps_measured",
    "walkthrough_bytes_per_parameter",
]
