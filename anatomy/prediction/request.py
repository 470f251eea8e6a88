"""The prediction's one entry: a request (the run's options, the device it is for, the dataset's
lengths, the batch a stored run measured, workspaces measured on the GPU) in, its answer out.
`predict`, `sweep`, the run form and the Anatomy page ask it; each reads the parts it shows,
computed when first read (a run of several processes need not predict one process alone, nor
a form the largest batch size).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import RunOptions
from anatomy.prediction.batches import DataPrediction, longest, predict_data
from anatomy.prediction.limits import Verdict, judge
from anatomy.prediction.memory import (
    BatchFit,
    Prediction,
    RankPrediction,
    max_batch_size,
    predict,
    predict_ranks,
)
from anatomy.prediction.replay import Recording
from anatomy.prediction.target import Target
from anatomy.store import TrainingData


@dataclass(frozen=True)
class Request:
    options: RunOptions
    target: Target
    data: TrainingData | None = None  # a dataset's run: its texts' lengths, as tokenized
    # The run's recording with its convolutions' workspaces measured on the target GPU
    # (memory.measured_recording), in place of the band and the convolution margin.
    measured: Recording | None = None
    # The batch of texts one process is predicted at, as the collator padded it (a stored run's:
    # the one its components were measured on), in place of a dataset's longest.
    text: TextBatch | None = None


class Answer:
    """A request's prediction, part by part; PredictionError where a part cannot be made."""

    def __init__(self, request: Request):
        self.request = request

    @cached_property
    def _longest(self) -> tuple[TextBatch, Prediction] | None:
        """A dataset's longest batch and its prediction (None: the dummy data)."""
        request = self.request
        device, gpu_name = request.target.device, request.target.gpu_name
        if request.data is None:
            return None
        return longest(request.options, request.data, device=device, gpu_name=gpu_name,
                       total=request.target.bound)

    @cached_property
    def data(self) -> DataPrediction | None:
        """A dataset's run at its longest batch and a typical one."""
        request = self.request
        device, gpu_name = request.target.device, request.target.gpu_name
        if request.data is None:
            return None
        return predict_data(request.options, request.data, device=device, gpu_name=gpu_name,
                            total=request.target.bound, found=self._longest)

    @property
    def longest(self) -> TextBatch | None:
        """A dataset's longest batch: the run's peak, where everything else is judged."""
        return self._longest[0] if self._longest else None

    @property
    def batch(self) -> TextBatch | None:
        """The batch of texts one process is predicted at: the request's, else a dataset's
        longest; None for the dummy data."""
        return self.request.text if self.request.text is not None else self.longest

    @cached_property
    def alone(self) -> Prediction:
        """One process's prediction (a dataset's at its longest batch, unless the request names
        another)."""
        request = self.request
        if request.text is None and self._longest is not None:
            return self._longest[1]
        device, gpu_name = request.target.device, request.target.gpu_name
        return predict(request.options, device=device, gpu_name=gpu_name,
                       total=request.target.bound, measured=request.measured, text=request.text)

    @cached_property
    def ranks(self) -> RankPrediction | None:
        """Each rank's, for a run of several processes."""
        if not self.request.options.distributed:
            return None
        device, gpu_name = self.request.target.device, self.request.target.gpu_name
        return predict_ranks(self.request.options, device=device, gpu_name=gpu_name,
                             text=self.batch)

    @cached_property
    def verdict(self) -> Verdict | None:
        """One process against its device: whether it fits and which limit decides (a rank's
        own peak is in the ranks' prediction)."""
        if self.request.options.distributed:
            return None
        aimed = self.request.target
        return judge(self.request.options, device=aimed.device, total=aimed.total,
                     gpu_name=aimed.gpu_name, measured=self.request.measured, text=self.batch,
                     front=aimed.front)

    def largest_batch(self, measure=None) -> BatchFit:
        """The largest batch size predicted to fit the device, other options unchanged;
        `measure` (workspaces.Measurer): cuDNN's convolution workspaces measured on this GPU."""
        aimed = self.request.target
        return max_batch_size(self.request.options, device=aimed.device, total=aimed.total,
                              gpu_name=aimed.gpu_name, measure=measure, front=aimed.front)


def answer(request: Request) -> Answer:
    return Answer(request)
