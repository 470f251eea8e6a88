"""A run's memory, measured next to predicted, computed without Streamlit: the prediction for
the run's own options (each rank's for several processes) and the components it measured. A run
on a dataset is predicted at the micro-batch its components were measured on, and apart from it
at the longest batch its data can form (`data_reach`), beside its sampled peak over every step.

The measured side is the report's components (anatomy/analysis/components.py); the predicted
side is the prediction's one entry (`answer`, prediction/request.py), as `predict`, `sweep` and
the run form ask it, for the run's own options on the run's kind of device (`ran_on`: a GPU
run's GPU model's calibrated constants, for the CUDA context, the allocator and NVML's figure).
The Anatomy page names and arranges them (anatomy/views/anatomy.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

from anatomy import strategies
from anatomy.analysis import carried_model, dummy_data, models
from anatomy.analysis.components import Components, measured_batch
from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import ReportedOptions, RunOptions
from anatomy.analysis.report import RunReport
from anatomy.analysis.report import report as run_report
from anatomy.prediction import (
    Prediction,
    PredictionError,
    RankPrediction,
    Request,
    answer,
    ran_on,
)
from anatomy.store import Store
from anatomy.vocabulary import Backend, Phase, SourceKind, Status


class NoPrediction(NamedTuple):
    """Why a run has no prediction, in words that end a sentence beginning "No prediction: "."""

    reason: str


def predicted(report: RunReport) -> Prediction | NoPrediction:
    """The prediction for the run's own options, with the kernels of the device it ran on (and
    that GPU model's constants); or why there is none: a user's training that recorded no model
    (the phase API, a command watched without the callback), a model that cannot be built here
    (a config file that stayed on the machine the run came from, an architecture the tracing
    cannot run)."""
    with _own_options(report) as options:
        if isinstance(options, NoPrediction):
            return options
        left_out = _left_out(report, options)
        if left_out is not None:
            return left_out
        data = report.environment.data if options.on_dataset else None
        if options.on_dataset and data is None:
            return NoPrediction("the run stored no lengths of its dataset's texts")
        # A run on a dataset: at the micro-batch its components were measured on (a collator
        # that pads each batch to its own longest makes every batch another shape); a run
        # stored before the probe said which, at its longest batch, from the lengths it stored.
        text = measured_batch(report.components, data)
        if data is None and text is not None and text.padded_to != options.seq_len:
            # A user's padded batch shorter than the longest it trained on: the peak is made
            # at the longest, whose padding the callback did not see.
            text = None
        said = answer(Request(options, ran_on(report), data, text=text))
        try:
            alone = said.alone
            frozen = _frozen(report, alone)
            if frozen is not None:
                return frozen
            if report.world_size > 1 and options.distributed:
                # A rank of several: its own shares and buffers (rank 0's GPU is the one shown).
                return said.ranks.as_prediction()
            return alone
        except PredictionError as error:  # its model is not here, or the trace refuses it
            return NoPrediction(f"{error}")


def _frozen(report: RunReport, prediction: Prediction | None) -> NoPrediction | None:
    """Why there is none for a user's training that trained another share of its model's
    parameters than the prediction's model: the script froze some itself (requires_grad=False)
    where the callback could not record which (frozen in more pieces than a run records, a
    model under peft's adapters whose embeddings the script trains too), and their gradients
    and states would be mispredicted; None where the two train the same, or the run does not
    say."""
    facts = report.environment
    trained, parameters = facts.trainable_parameters, facts.parameters
    if trained is None or prediction is None or parameters != prediction.parameters or \
            trained == prediction.trainable_parameters:
        return None
    return NoPrediction(f"it trained {trained:,} of its {parameters:,} parameters, and anatomy "
                        f"predicts {prediction.trainable_parameters:,} trained (which parameters "
                        "the script froze or trained itself, by requires_grad, was not "
                        "recorded)")


def _left_out(report: RunReport, options: RunOptions) -> NoPrediction | None:
    """Why a user's training trained more than its prediction would hold (its images, its
    adapters' extras, an optimizer anatomy does not run); None where nothing is left out."""
    return _media_left_out(report, options) or _body_trained(report, options) or \
        _not_predicted(report)


def _trained_class(report: RunReport) -> str | None:
    """The head class a user's training trained: the class it recorded where that is one of
    transformers' tables (a run stored before the callback wrote it as the architecture),
    else its carried config's (a script's own subclass: transformers' class it derives from)."""
    recorded = report.environment.model_class
    if recorded and (models.head_task(recorded) or models.is_body(recorded)):
        return recorded
    config = report.environment.model_config or {}
    named = config.get("architectures") or [report.environment.model_class]
    return named[0] if isinstance(named, list) and isinstance(named[0], str) else None


def _body_trained(report: RunReport, options: RunOptions) -> NoPrediction | None:
    """Why there is none for a user's training of a pre-training head or a bare model, a body
    that anatomy trains as its model type's task (a sequence classifier): another output,
    another loss; None otherwise (a masked-LM head is predicted as one)."""
    trained = _trained_class(report)
    if report.started_by_anatomy or not trained or not models.is_body(trained) or \
            models.is_masked_lm(trained):
        return None
    try:
        task = models.resolve(options.model).task
    except models.ModelError:
        return None  # the prediction says why it cannot build the model
    return NoPrediction(f"it trained {trained}, a head anatomy does not train (it would "
                        f"predict the model as {task})")


def _media_left_out(report: RunReport, options: RunOptions) -> NoPrediction | None:
    """Why there is none for a user's training whose batches held inputs the prediction's batch
    does not (a vision-language model trained with its images, predicted on its text alone:
    its vision tower's activations, gradients and states would be missing); None otherwise."""
    media = report.environment.media_inputs
    if not media:
        return None
    try:
        made = {name for name, _ in dummy_data.sample(models.resolve(options.model),
                                                      options.seq_len,
                                                      options.target_len).tensors}
    except models.ModelError:
        return None  # the prediction says why it cannot build the model
    left = [name for name in media if name not in made]
    if not left:
        return None
    return NoPrediction(f"its batches held {', '.join(left)}, and anatomy predicts this model on "
                        "its text alone (its vision or audio tower's activations, gradients and "
                        "optimizer states would be left out)")


def _not_predicted(report: RunReport) -> NoPrediction | None:
    """Why there is none for a user's training that did what the prediction does not build:
    what the callback saw (adapters beyond LoRA, weights in bf16, label smoothing: `left_out`)
    and what it reported that anatomy's own runs do not take (an optimizer of bitsandbytes,
    whose 8-bit states would have been AdamW's 32-bit ones, a default in its place); None
    where there is none of it."""
    said = list(report.environment.left_out or ())
    if isinstance(report.ran_with, ReportedOptions):
        said += report.ran_with.beyond().values()
    if not said:
        return None
    return NoPrediction(f"it trained with what anatomy does not predict ({'; '.join(said)})")


class DataReach(NamedTuple):
    """What a run's dataset can reach, apart from the batch its components were measured on:
    the longest batch the data can form and the prediction there, which the run's sampled peak
    over every step (`measured_peak`: RSS or NVML) is held against."""

    measured: TextBatch  # the micro-batch the components describe
    longest: TextBatch
    prediction: Prediction


def data_reach(report: RunReport) -> DataReach | None:
    """The prediction at the longest batch of a run on a dataset whose components say which
    batch they were measured on; None for other runs (a run stored before: `predicted` is at its
    longest batch already), or where there is no prediction."""
    data = report.environment.data
    measured = measured_batch(report.components, data)
    if measured is None or not report.options.on_dataset:
        return None
    with _own_options(report) as options:
        if isinstance(options, NoPrediction) or _left_out(report, options):
            return None
        said = answer(Request(options, ran_on(report), data))
        try:
            batch = said.longest
            reached = said.ranks.as_prediction() if report.world_size > 1 and \
                options.distributed else said.alone
        except PredictionError:
            return None
    return DataReach(measured, batch, reached)


@contextmanager
def _own_options(report: RunReport) -> Iterator[RunOptions | NoPrediction]:
    """The run's options with the model it carries (analysis/carried_model.py): the config it
    kept, whoever started it; a run that kept none (a preset, a run stored before runs kept
    their config) by the name it stored — or, where that is no model here or a user's training
    recorded none, why there is nothing to predict."""
    config = report.environment.model_config
    if config is not None:
        # Named as lists show the run's model (a user's by its class, which every refusal names
        # it by: "model: LlamaForCausalLM: …"), not by the folder it is read from.
        name = (report.model if report.started_by_anatomy else None) or \
            report.environment.model_class or "model"
        trained = _trained_class(report)
        if not report.started_by_anatomy and trained:
            # the head a user's training trained (a run stored before the callback recorded it
            # as the architecture kept the checkpoint's); a masked-LM head trains as one, where
            # a config of anatomy's own run that names one trains its model type's task
            config = {**config, "architectures": [trained],
                      **({models.TRAINED_HEAD: trained} if models.is_masked_lm(trained) else {})}
        with carried_model.model_folder(config, name) as folder:
            yield replace(report.options, model=folder)
        return
    if not report.started_by_anatomy:
        yield NoPrediction(_no_model(report))
        return
    try:
        models.resolve(report.options.model)
    except models.ModelError as error:
        yield NoPrediction(_not_here(report, error))
        return
    yield report.options


def _not_here(report: RunReport, error: models.ModelError) -> str:
    """Why a run that kept only its model's name has no model here: the file or folder it named
    (a relative path names one from where the run started) is not found, or is no model."""
    name, source = report.options.model, report.environment.model_source
    gone = source in carried_model.FILES and carried_model.local_path(name) is None
    return (f"{f'model: no such {source}: {name}' if gone else error} (the run names its model "
            "as it was given where it started, and was recorded before runs kept their model's "
            "config)")


def _no_model(report: RunReport) -> str:
    """Why a user's training left nothing to predict from: how it was recorded."""
    if report.source.kind == SourceKind.WATCH:
        return ("the command was watched without anatomy's callback, so the run recorded no "
                "model (a Trainer with callbacks=[anatomy.AnatomyCallback()] records its config)")
    return ("the phase API records no model (a Trainer with callbacks=[anatomy.AnatomyCallback()] "
            "records its config)")


def prediction_for(report: RunReport) -> Prediction | None:
    """`predicted`, None where there is no prediction."""
    result = predicted(report)
    return None if isinstance(result, NoPrediction) else result


def parameters(report: RunReport, prediction: Prediction) -> int:
    """The model's parameters as the worker counted them; the preset's count for older runs."""
    return report.parameters or prediction.parameters


def measured_components(report: RunReport) -> Components:
    """The run's measured components; for a GPU run recorded without them, what its phases alone
    tell: the CUDA context (kernel − baseline) and NVML's peak over the baseline."""
    if report.components is not None:
        return report.components
    values = Components()
    memory = report.phase_memory()
    baseline, kernel = memory[Phase.BASELINE], memory[Phase.KERNEL]
    peak = report.summary.training_peak_bytes  # a training step's, as the prediction
    if report.on_gpu and baseline is not None:
        if kernel is not None:
            values = replace(values, context=kernel - baseline)
        if peak is not None:
            values = replace(values, peak=peak - baseline)
    return values


class CpuPeak(NamedTuple):
    """A CPU run's RSS peak as far as a prediction reaches: the tensors' peak (predicted) on top
    of what the process held before training beyond its weights (measured at the end of the
    weights phase: the interpreter, torch's libraries, the data; never predicted). Bytes, over
    `over` (the baseline's RSS where the run measured one, else 0: the RSS itself)."""

    before_training: int  # measured: the weights phase's RSS less the weights, less `over`
    tensors: int  # predicted: the tensors' peak (the weights included)
    over: int

    @property
    def peak(self) -> int:
        return self.before_training + self.tensors

    @property
    def process(self) -> int:
        """What the process held before training beyond its weights, the baseline included."""
        return self.over + self.before_training

    @property
    def rss(self) -> int:
        """The predicted RSS peak itself: the process and the tensors' peak."""
        return self.process + self.tensors


def cpu_peak(report: RunReport, prediction: Prediction) -> CpuPeak | None:
    """The predicted RSS peak of a CPU run, on the axis of its measured curve; None on a GPU or
    before its weights phase ended."""
    memory = report.phase_memory()
    if report.on_gpu or memory[Phase.WEIGHTS] is None:
        return None
    measured = report.components.weights if report.components else None
    weights = measured if measured is not None else prediction.weights
    over = memory[Phase.BASELINE] or 0
    return CpuPeak(memory[Phase.WEIGHTS] - weights - over, prediction.peak, over)


def process_share(report: RunReport, prediction: Prediction) -> int | None:
    """What a CPU run's process held beside its tensors at its peak: its RSS peak less the
    tensors' predicted peak — the interpreter, torch, transformers, the data, and what the C
    allocator keeps of the tensors it freed. What bench/cpu_process_share.py measures of CPU
    runs for a CPU's capacity (prediction/memory.py's `CPU_PROCESS`). None on a GPU or
    without a sample."""
    peak = report.summary.training_peak_bytes
    if report.on_gpu or peak is None:
        return None
    return peak - prediction.peak


def stored_cpu_peak(store: Store, prediction: Prediction) -> tuple[int, CpuPeak] | None:
    """A CPU prediction before its run starts, as `cpu_peak` reads a run: the tensors' predicted
    peak on what the latest completed CPU run stored here held before training beyond its
    weights (its own weights measured). That run's id with it; None without such a run."""
    for run in store.runs():  # newest first
        if run.backend != Backend.CPU_RSS or run.status != Status.COMPLETED:
            continue
        measured = run_report(store, run.id, run)
        if measured.components is None or measured.components.weights is None:
            continue
        expected = cpu_peak(measured, prediction)
        if expected is not None:
            return run.id, expected
    return None


def measured_peak(report: RunReport) -> int | None:
    """The sampled peak as the table shows it: over the baseline where the run measured one."""
    return _over_baseline(report, report.summary.peak_bytes)


def training_peak(report: RunReport) -> int | None:
    """The sampled peak a training step's prediction is held against, as `measured_peak` reads
    it: before the first evaluation of a Trainer that evaluated while it trained."""
    return _over_baseline(report, report.summary.training_peak_bytes)


def _over_baseline(report: RunReport, peak: int | None) -> int | None:
    baseline = report.phase_memory()[Phase.BASELINE]
    return None if peak is None else peak - (baseline or 0)


def error_percent(measured: int | None, predicted: int | None) -> float | None:
    """(predicted − measured) / measured, in %; None where either is missing or measured is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    return (predicted - measured) / measured * 100


def rank_prediction_for(report: RunReport) -> RankPrediction | None:
    """Each rank's prediction for a run of several processes, of its own model; None for one
    process, a user's launch that recorded no model, or a model that cannot be built here."""
    if report.world_size < 2:
        return None
    with _own_options(report) as own:
        if isinstance(own, NoPrediction) or _left_out(report, own):  # no model, or more than it
            return None
        # A user's launch that did not say: the Trainer's own way.
        options = replace(own, strategy=report.strategy or strategies.DEFAULT)
        if not options.distributed:  # a run whose options did not say (the user's own script)
            options = replace(options, processes=report.world_size)
        data = report.environment.data if options.on_dataset else None
        try:
            return answer(Request(options, ran_on(report), data)).ranks
        except PredictionError:
            return None


def predicted_peak(report: RunReport) -> int | None:
    """The prediction's peak on the axis of the run's samples: NVML's figure on a GPU, the RSS
    on a CPU (from the end of its weights phase, which the RSS prediction stands on); None
    where the run has no prediction (`prediction_for` says why on the Anatomy page)."""
    prediction = prediction_for(report)
    return None if prediction is None else peak_on_axis(report, prediction)


def peak_on_axis(report: RunReport, prediction: Prediction) -> int | None:
    """`prediction`'s peak on the axis of the run's samples (see `predicted_peak`)."""
    if report.on_gpu:
        return prediction.nvml_peak
    cpu = cpu_peak(report, prediction)
    return None if cpu is None else cpu.rss
