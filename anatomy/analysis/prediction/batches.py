"""A run on a dataset, predicted from its texts' lengths (what analysis/data.py tokenized, or a
stored run's facts): at the longest batch the data and the collator can form, which is the run's
peak, and beside it at a typical batch (analysis/lengths.py says which batches these are).
"""

from __future__ import annotations

from typing import NamedTuple

from anatomy.analysis.lengths import Lengths, TextBatch, longest_batch, typical_batch
from anatomy.analysis.options import RunOptions
from anatomy.analysis.prediction.memory import Prediction, predict
from anatomy.store import TrainingData


class DataBatches(NamedTuple):
    """The batches a dataset's run is predicted at."""

    lengths: Lengths
    longest: TextBatch
    typical: TextBatch


class DataPrediction(NamedTuple):
    batches: DataBatches
    longest: Prediction  # the run's peak
    typical: Prediction


def batches(options: RunOptions, data: TrainingData) -> DataBatches:
    """The longest and the typical batch of `options.batch_size` texts of the data, padded as
    the run pads them."""
    lengths = Lengths(data.lengths or ())
    inputs = data.inputs if data.inputs is not None else ("attention_mask",)
    side = data.padding_side or "right"
    cut = data.max_length or 0
    return DataBatches(
        lengths,
        longest_batch(lengths, options.batch_size, options.padding, cut, inputs, side),
        typical_batch(lengths, options.batch_size, options.padding, cut, inputs, side))


def longest_text_batch(options: RunOptions, data: TrainingData | None) -> TextBatch | None:
    """The batch a run on a dataset is predicted at (its peak); None on the dummy data."""
    if not options.dataset.strip() or data is None:
        return None
    return batches(options, data).longest


def predict_data(options: RunOptions, data: TrainingData, *, device: str,
                 gpu_name: str | None = None) -> DataPrediction:
    """The run predicted at its longest batch and at a typical one."""
    found = batches(options, data)
    return DataPrediction(found, predict(options, device=device, gpu_name=gpu_name,
                                         text=found.longest),
                          predict(options, device=device, gpu_name=gpu_name, text=found.typical))
