"""The prediction's one entry: a request (the run's options, the device it is for, the dataset's
lengths, workspaces measured on the GPU) in, its answer out. `predict` and the run form ask it;
each reads the parts it shows, computed when first read (a run of several processes need not
predict one process alone, nor a form the largest batch size).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import RunOptions
from anatomy.prediction.batches import DataPrediction, predict_data
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


class Answer:
    """A request's prediction, part by part; PredictionError where a part cannot be made."""

    def __init__(self, request: Request):
        self.request = request

    @cached_property
    def data(self) -> DataPrediction | None:
        """A dataset's run at its longest batch and a typical one."""
        request, (device, gpu_name, _) = self.request, self.request.target
        if request.data is None:
            return None
        return predict_data(request.options, request.data, device=device, gpu_name=gpu_name,
                            total=request.target.bound)

    @property
    def longest(self) -> TextBatch | None:
        """A dataset's longest batch: the run's peak, where everything else is judged."""
        return self.data.batches.longest if self.data else None

    @cached_property
    def alone(self) -> Prediction:
        """One process's prediction (a dataset's at its longest batch)."""
        if self.data is not None:
            return self.data.longest
        (device, gpu_name, _), request = self.request.target, self.request
        return predict(request.options, device=device, gpu_name=gpu_name,
                       total=request.target.bound, measured=request.measured)

    @cached_property
    def ranks(self) -> RankPrediction | None:
        """Each rank's, for a run of several processes."""
        if not self.request.options.distributed:
            return None
        device, gpu_name, _ = self.request.target
        return predict_ranks(self.request.options, device=device, gpu_name=gpu_name,
                             text=self.longest)

    @cached_property
    def verdict(self) -> Verdict | None:
        """One process against its device: whether it fits and which limit decides (a rank's
        own peak is in the ranks' prediction)."""
        if self.request.options.distributed:
            return None
        device, gpu_name, total = self.request.target
        return judge(self.request.options, device=device, total=total, gpu_name=gpu_name,
                     measured=self.request.measured, text=self.longest)

    def largest_batch(self, measure=None) -> BatchFit:
        """The largest batch size predicted to fit the device, other options unchanged;
        `measure` (workspaces.Measurer): cuDNN's convolution workspaces measured on this GPU."""
        device, gpu_name, total = self.request.target
        return max_batch_size(self.request.options, device=device, total=total,
                              gpu_name=gpu_name, measure=measure)


def answer(request: Request) -> Answer:
    return Answer(request)
