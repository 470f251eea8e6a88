"""A run on a dataset, predicted from its texts' lengths (what analysis/data.py tokenized, or a
stored run's facts): at the longest batch the data and the collator can form, which is the run's
peak, and beside it at a typical batch (analysis/lengths.py says which batches these are).
"""

from __future__ import annotations

from typing import NamedTuple

from anatomy.analysis.lengths import Lengths, TextBatch, longest_batches, typical_batch
from anatomy.analysis.options import RunOptions
from anatomy.prediction.memory import Prediction, predict
from anatomy.store import TrainingData


class DataBatches(NamedTuple):
    """The batches a dataset's run is predicted at."""

    lengths: Lengths
    longest: TextBatch  # the run's peak
    typical: TextBatch
    facts: TrainingData | None = None  # what they were read from (the time a step scales by it)


class DataPrediction(NamedTuple):
    batches: DataBatches
    longest: Prediction
    typical: Prediction


def _shape(options: RunOptions, data: TrainingData) -> tuple:
    """The padding, the length texts are cut at, the tokenizer's other inputs and its side."""
    inputs = data.inputs if data.inputs is not None else ("attention_mask",)
    return options.padding, data.max_length or 0, inputs, data.padding_side or "right"


def longest(options: RunOptions, data: TrainingData, *, device: str,
            gpu_name: str | None = None, total: int | None = None
            ) -> tuple[TextBatch, Prediction]:
    """The longest batch the data can form and its prediction: of `longest_batches`, the one
    predicted to need the most (the allocator's peak, then NVML's, then the activations)."""
    def need(predicted: Prediction) -> tuple[int, int, int]:
        return predicted.peak, predicted.nvml_peak or 0, predicted.activations

    found: tuple[TextBatch, Prediction] | None = None
    lengths = Lengths(data.lengths or ())
    for batch in longest_batches(lengths, options.batch_size, *_shape(options, data)):
        predicted = predict(options, device=device, gpu_name=gpu_name, total=total, text=batch)
        if found is None or need(predicted) > need(found[1]):
            found = (batch, predicted)
    return found


def predict_data(options: RunOptions, data: TrainingData, *, device: str,
                 gpu_name: str | None = None, total: int | None = None,
                 found: tuple[TextBatch, Prediction] | None = None) -> DataPrediction:
    """The run predicted at its longest batch and at a typical one; `total`: the GPU's memory,
    as `predict` takes it; `found`: the longest batch and its prediction, where known."""
    batch, predicted = found or longest(options, data, device=device, gpu_name=gpu_name,
                                        total=total)
    lengths = Lengths(data.lengths or ())
    typical = typical_batch(lengths, options.batch_size, *_shape(options, data))
    return DataPrediction(DataBatches(lengths, batch, typical, data), predicted,
                          predict(options, device=device, gpu_name=gpu_name, total=total,
                                  text=typical))
