"""Trainer callbacks, one job each, in the Trainer's own style: the worker composes them, and they
are what a user's own Trainer gets. Each reports through a `Reporter`.

- `PhaseMarks`: the training phase begins at on_train_begin and ends at on_train_end;
- `StepReports`: every optimizer step with its loss and the allocator's figures;
- `Evaluations`: when the Trainer first evaluates: before it trains (the run's options are
  then the evaluation's), or once training has begun;
- `ComponentProbing`: the component probe over the first steps (engine/probe.py);
- `FaultInjection`: a test's out-of-memory error or crash at a given step.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from anatomy.analysis import carried_model, libraries, models
from anatomy.analysis.dummy_data import MEDIA_INPUTS
from anatomy.engine.endings import Ending
from anatomy.engine.figures import LinkedReader, Reader
from anatomy.engine.predicting import Answer, Predicting
from anatomy.engine.probe import MEASURED_STEPS, ComponentProbe
from anatomy.engine.reporter import Reporter
from anatomy.store import RunFacts, Step, TrainingArguments, TrainingSummary
from anatomy.vocabulary import Attention, Level, Phase, Precision, Status, Weights

if TYPE_CHECKING:  # attach is imported where it is used: the worker's callbacks need no run
    from anatomy.engine.attach import Underway

INJECT_ENV = "ANATOMY_INJECT"  # tests only: "oom@STEP" or "crash@STEP"
LAST_FIGURES_WAIT = 2.0  # seconds the training phase's memory is waited for as training ends
# What a Trainer that never trains may do instead, said as its run ends: the call, what it made
UNTRAINED = {"evaluate": ("evaluated (trainer.evaluate())", "evaluation"),
             "predict": ("predicted (trainer.predict())", "prediction")}


def _cuda_ooms() -> int | None:
    """How many out-of-memory errors CUDA's caching allocator has raised in this process; None
    where CUDA is not in use (nothing is initialised to ask)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return sum(int(torch.cuda.memory_stats(device).get("num_ooms", 0))
               for device in range(torch.cuda.device_count()))


class PhaseMarks(TrainerCallback):
    """Marks the training phase: from on_train_begin to on_train_end."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def on_train_begin(self, args, state, control, **kwargs):
        self.reporter.begin(Phase.TRAINING)

    def on_train_end(self, args, state, control, **kwargs):
        self.reporter.end(Phase.TRAINING)


class StepReports(TrainerCallback):
    """Reports every step with its loss and the allocator's figures. The Trainer logs a step's
    loss just after on_step_end, so a step is sent from on_log (or, if nothing is logged, at the
    next step or the end of training)."""

    def __init__(self, reporter: Reporter, use_cuda: bool, lengths: BatchLengths | None = None):
        self.reporter, self.use_cuda, self.lengths = reporter, use_cuda, lengths
        self.pending: Step | None = None

    def flush(self, loss: float | None = None) -> None:
        if self.pending is not None:
            self.reporter.step(self.pending._replace(loss=loss))
            self.pending = None

    def on_step_end(self, args, state, control, **kwargs):
        self.flush()
        allocated, reserved = ((torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
                               if self.use_cuda else (None, None))
        self.pending = Step(self.reporter.now(), state.global_step, state.max_steps, None,
                            allocated, reserved,
                            seq_len=self.lengths.take() if self.lengths is not None else None)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.flush(float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.flush()


class BatchLengths:
    """The sequence length each step of a user's Trainer trained at: a forward pre-hook on the
    model reads its token ids' shape (metadata: nothing is synchronised, nothing copied), and a
    step keeps the longest of its batches. A data collator that pads each batch to its own
    longest makes them differ step by step. The inputs that are no text (MEDIA_INPUTS) are told
    to `media` as they first come."""

    def __init__(self, model, media=None):
        self.step: int | None = None  # the longest since the last step
        self.longest: int | None = None  # the longest of the run
        # An encoder-decoder's targets (its decoder's inputs, else its labels): the longest of
        # the run; a summary's or a translation's are seldom as long as their sources.
        self.target: int | None = None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.seq2seq = bool(getattr(getattr(base, "config", None), "is_encoder_decoder", False))
        self.media: tuple[str, ...] = ()  # the inputs that are no text, seen so far
        self._told = media
        self.handle = model.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module, args, kwargs) -> None:
        if not module.training:  # an evaluation's batch (eval_strategy="steps"): no training's
            return
        media = tuple(n for n in MEDIA_INPUTS if kwargs.get(n) is not None or n in self.media)
        if media != self.media:
            self.media = media
            if self._told is not None:
                self._told(media)
        tokens = kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")  # (batch, sequence, hidden)
        shape = getattr(tokens, "shape", None)
        if shape is not None and len(shape) >= 2:  # images and the like: no sequence to read
            self.step = max(self.step or 0, int(shape[1]))
        if self.seq2seq:
            target = kwargs.get("decoder_input_ids")
            if target is None:
                target = kwargs.get("labels")
            shape = getattr(target, "shape", None)
            if shape is not None and len(shape) == 2:  # (batch, tokens): not codebooks
                self.target = max(self.target or 0, int(shape[1]))

    def take(self) -> int | None:
        """The step's longest sequence, from here on the next step's."""
        found, self.step = self.step, None
        if found is not None:
            self.longest = max(self.longest or 0, found)
        return found


class Evaluations(TrainerCallback):
    """Tells the run when the Trainer first evaluates once it has begun training (eval_strategy
    while it trains, or `trainer.evaluate()` after it, as transformers' example scripts do), and
    at which batch size: a forward pre-hook on the model sees the first batch the model reads
    out of training mode. From then on the memory holds what no training step does (the
    evaluation's batches, the logits it keeps, the cache it leaves reserved), so the run's
    training is read next to its prediction before it. Rank 0 tells it for the run; nothing is
    told into a run that has ended. The first such batch before training has begun is told to
    `untrained` (`evaluate()` or `predict()` before `train()`, or without it)."""

    def __init__(self, run, model, untrained: Callable[[], None] | None = None):
        self.run = run
        self.began = self.told = False
        self.batch_size: int | None = None
        self.untrained = untrained
        self.handle = model.register_forward_pre_hook(self._seen)

    def _seen(self, module, args) -> None:
        if module.training or self.told:
            return
        if not self.began:
            told, self.untrained = self.untrained, None
            if told is not None:
                told()
            return
        self.told = True
        self.handle.remove()
        reporter = self.run.reporter
        if not self.run.ended and not reporter.source.rank:
            reporter.environment(RunFacts(evaluated_at=reporter.now(),
                                          eval_batch_size=self.batch_size))

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = True
        self.batch_size = args.per_device_eval_batch_size


class ComponentProbing(TrainerCallback):
    """Runs the component probe over the first MEASURED_STEPS steps and reports what it found,
    once: after those steps, or at the end of training if it is shorter."""

    def __init__(self, reporter: Reporter, probe: ComponentProbe):
        self.reporter, self.probe = reporter, probe
        self.first = 0  # the global step training began at: a resumed one's checkpoint's

    def _measuring(self, state) -> bool:
        return state.global_step - self.first < MEASURED_STEPS

    def _report(self) -> None:
        if self.probe.forwards:  # measured at least one step, and not reported yet
            self.probe.close()
            self.reporter.components(self.probe.result())
            self.probe.forwards = 0

    def _safely(self, reading) -> None:
        """A reading of the probe; one that fails (a tensor kind it does not know, such as a
        wrapper a sharding strategy makes) ends the probe, said once, never the training."""
        if self.failed:
            return
        try:
            reading()
        except Exception as error:  # noqa: BLE001 - the training matters more than a reading
            self.failed = True
            self.probe.forwards = 0
            try:
                self.probe.close()
            except Exception:  # noqa: BLE001
                pass
            self.reporter.tell(Level.WARNING, f"the component probe stopped: {type(error).__name__}:"
                               f" {error}; the run goes on without measured components")

    failed = False

    def on_train_begin(self, args, state, control, **kwargs):
        # A resume (`train(resume_from_checkpoint=…)`) starts past step MEASURED_STEPS: its
        # first steps are counted from there, or its gradients and optimizer states went unread.
        self.first = state.global_step

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._measuring(state):
            self._safely(self.probe.before_optimizer_step)

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._measuring(state):
            self._safely(lambda: self.probe.after_optimizer_step(optimizer))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step - self.first == MEASURED_STEPS:
            self._safely(self._report)

    def on_train_end(self, args, state, control, **kwargs):
        self._safely(self._report)


class FaultInjection(TrainerCallback):
    """Tests only: from step N on, raise CUDA's out-of-memory error ("oom@N") or die without a
    word as a killed process would ("crash@N"), after that step has been reported. "oom@N:R"
    faults only the training process of rank R (of several)."""

    def __init__(self, kind: str, step: int, steps: StepReports):
        self.kind, self.step, self.steps = kind, step, steps

    @classmethod
    def from_environment(cls, steps: StepReports) -> FaultInjection | None:
        value = os.environ.get(INJECT_ENV)
        if not value:
            return None
        kind, _, where = value.partition("@")
        step, _, rank = where.partition(":")
        if rank and rank != os.environ.get("RANK", "0"):
            return None
        return cls(kind, int(step or 1), steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < self.step:
            return
        self.steps.flush()
        if self.kind == Status.OOM:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 1.00 GiB (injected by {INJECT_ENV} for a "
                "test)")
        if self.kind == "crash":
            os._exit(9)


class AnatomyCallback(TrainerCallback):
    """Records a Hugging Face Trainer's training with anatomy: `AnatomyCallback.attach(trainer)`
    (its figures reach report_to's trackers), or `Trainer(..., callbacks=[AnatomyCallback()])`.

    It joins the run `anatomy.start()` began (which saw the baseline and the CUDA context), or
    the one `anatomy watch` runs the script in, else starts one itself. It marks the weights
    phase when the Trainer is built (the model is on its device), the training phase from
    on_train_begin to on_train_end, reports every step with its loss, runs the component probe
    over the first steps, and ends the run it started when training ends (an error that escapes
    `train()` ends it as failed or oom); a run whose Trainer never trained (`evaluate()` alone)
    says so as it ends. It adds no synchronisation: the allocator's figures are
    host-side counters.

    Its figures join the Trainer's logs (engine/figures.py names them), so that every
    integration of `report_to` logs them as it logs the loss (attached: `attach`); anatomy
    imports none of them. The predicted peak joins them once worked out beside the training
    (engine/predicting.py; `predict=False` does without). `name`, `sample_rate` (default 200)
    and `store` are those of the run it starts, as `anatomy.start()` takes them."""

    def __init__(self, name: str | None = None, *, sample_rate: int | None = None, store=None,
                 probe: bool = True, predict: bool = True):
        from anatomy.engine import attach

        self._start = functools.partial(attach.start, name, sample_rate=sample_rate, store=store,
                                        kernel=False, baseline=False)
        joined = self._take_run()
        if joined is not None and not joined.by_callback:  # the script's own run (or the watch's)
            attach.said_unused(joined, "AnatomyCallback", name=name, store=store,
                               sample_rate=sample_rate)
        # A run another Trainer's callback started (two Trainers built, then trained in turn)
        # ends with that Trainer's training: this one's training then gets a run of its own, as
        # a second `train()` does, rather than going unrecorded.
        self.renews_run = self.owns_run or (joined is not None and joined.by_callback)
        self.probe, self.predict = probe, predict
        self._predicting: Predicting | None = None  # the predicted peak, worked out beside
        self._callbacks: list[TrainerCallback] = []
        # the options on_init_end read, and the model's name
        self._described: tuple[TrainingArguments, str | None] | None = None
        self._lengths: BatchLengths | None = None
        self._longest_said: dict[str, int] | None = None  # the lengths described last
        self._reader: Reader | LinkedReader | None = None  # the run's figures, for the logs
        self._handler: CallbackHandler | None = None  # the Trainer's, once attached to it
        self._initialised = False  # the Trainer's on_init_end has come
        self._given_optimizer = None  # the script's own, given to the Trainer built
        self._predictable = False
        self._told_order = False
        self._logging = False  # the training's last figures are being logged
        self._did: list[tuple[str, str]] = []  # what the Trainer did but train: UNTRAINED's
        # The run's options told: the training's as it began, or an evaluation's before it
        self._told_options = False

    def _take_run(self):
        """The run this process records (joined), else one of its own; the run joined, if any."""
        from anatomy.engine import attach

        joined = attach.current()
        self.run = joined or self._start()
        self.owns_run = joined is None and not self.run.watched
        if self.owns_run:
            self.run.by_callback = True
        return joined

    @classmethod
    def attach(cls, trainer, name: str | None = None, *, sample_rate: int | None = None,
               store=None, probe: bool = True, predict: bool = True) -> AnatomyCallback:
        """Record `trainer`'s training, anatomy's figures in the logs of every integration of
        its `report_to`: `anatomy.AnatomyCallback.attach(trainer)`, the Trainer built, before
        `trainer.train()`. The Trainer calls its callbacks in turn, report_to's integrations
        before the callbacks it was given, and each logs the `logs` on_log hands it: this one
        goes first (through the Trainer's own pop_callback and add_callback), so that the
        figures it adds to a log reach every one in that log, and the training's last figures
        reach them through the Trainer's handler before they close. A callback given in
        `callbacks=[…]` already is moved, not made again (its own options stand)."""
        handler = trainer.callback_handler
        callback = next((c for c in handler.callbacks if isinstance(c, cls)), None)
        if callback is None:
            callback = cls(name, sample_rate=sample_rate, store=store, probe=probe,
                           predict=predict)
        others = [c for c in handler.callbacks if c is not callback]
        for other in [callback, *others]:
            trainer.pop_callback(other)
        for other in [callback, *others]:
            trainer.add_callback(other)
        callback._handler = handler
        if not callback._initialised:  # made here: the Trainer's on_init_end has come and gone
            callback.on_init_end(trainer.args, trainer.state, trainer.control, model=handler.model,
                                 trainer=trainer, optimizer=handler.optimizer)
        return callback

    def on_init_end(self, args, state, control, model=None, trainer=None, optimizer=None,
                    **kwargs):
        self._initialised = True
        # Built yet only where the script gave it (optimizers=(…)): the Trainer builds its own
        # as it trains.
        self._given_optimizer = optimizer
        if not self._records(state):
            return
        trainer = trainer or _calling_trainer()
        underway = self.run.training_underway
        if self.renews_run and underway is not None and underway.raised(trainer):
            return  # the run is the failed training's: this one is followed in its own
        self._follow(args, model, trainer)

    def _records(self, state, training_begins: bool = False) -> bool:
        """Whether this callback records the Trainer `state` is of: the first AnatomyCallback of
        a Trainer does. Another added to the same Trainer (twice in `callbacks=`, a library's
        and the script's) stays silent: each phase and step would be recorded twice. Nor is
        anything recorded into a run that has ended: the script's own `run.end()` before it
        trains is said once (it went unrecorded without a word); a run of the callback's own
        (or another Trainer's callback's) gives way to a new one when training begins again."""
        owner = getattr(state, "_anatomy_callback", None)
        if owner is None:
            # Not a field: never saved with the state. Its id, not itself: a state pickled (a
            # tuner's report) must not carry the run's recording along.
            state._anatomy_callback = owner = id(self)
        if owner != id(self):
            return False
        if self.run.ended and self.renews_run:
            return training_begins
        return not self.run.ended_before("a Trainer's training (AnatomyCallback)")

    def _follow(self, args, model, trainer=None) -> None:
        """Tell the run what trains (`trainer`: the Trainer, where known, for a step of its
        own), and follow it with the callbacks of one job each."""
        facts = _training_facts(args, model, self.run.of_a_launch, trainer,
                                self._given_optimizer)
        # The Trainer's arguments are the run's options from its init (a run killed before it
        # trains keeps them), an evaluation's where it evaluates before it trains
        # (`_describe_evaluation`), and the training's again as it trains.
        self._described = (facts.training_arguments, facts.model_name)
        self._told_options = False
        self.run.reporter.environment(facts)
        self.run.reporter.described(facts.training_arguments.to_dict(), facts.model_name)
        figures = self.run.figures()
        self._reader = figures.reader() if figures is not None else None
        if model is not None and self.run.reporter.open_phase != Phase.TRAINING:
            self.run.phase(Phase.WEIGHTS)
        use_cuda = torch.cuda.is_available() and args.device.type == "cuda"
        # a model of transformers' (its config is what the prediction builds it from)
        self._predictable = getattr(model, "config", None) is not None
        self._lengths = BatchLengths(model, self._media) if model is not None else None
        steps = StepReports(self.run.reporter, use_cuda, self._lengths)
        for earlier in self._callbacks:  # a Trainer followed again (train() once more)
            if isinstance(earlier, Evaluations):
                earlier.handle.remove()
        self._did = []  # of this run
        if self._untrained not in self.run.on_end:
            self.run.on_end.append(self._untrained)
        self._callbacks = [steps, PhaseMarks(self.run.reporter)]
        if model is not None:
            self._callbacks.append(Evaluations(
                self.run, model, functools.partial(self._describe_evaluation, args)))
        if self.probe and model is not None:
            self._callbacks.append(ComponentProbing(self.run.reporter, ComponentProbe(
                model, use_cuda, args.per_device_train_batch_size)))

    def _media(self, names: tuple[str, ...]) -> None:
        """The inputs other than text the training's batches hold, for the run's facts: the
        prediction, which makes a vision-language model's text alone, says it has none."""
        self.run.reporter.environment(RunFacts(media_inputs=names))

    def _each(self, event: str, *args, **kwargs) -> None:
        for callback in self._callbacks:
            getattr(callback, event)(*args, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        if not self._records(state, training_begins=True):
            return
        self._tell_order(args)
        trainer = _calling_trainer()
        underway = self.run.training_underway
        if underway is not None and underway.raised(trainer):
            self._end_raised(underway)
        if self.renews_run and self.run.ended:
            # train() again (hyperparameter_search, a resume): the run it ended was the last
            # training's, and this one went unrecorded; it has a run of its own.
            self._take_run()
            self._follow(args, kwargs.get("model"), _calling_trainer())
        if self.run.reporter.open_phase:  # e.g. a phase the user's script opened
            self.run.reporter.end(self.run.reporter.open_phase)
        if self._described is not None:
            # Read again: a script may set its Trainer's arguments between building it and
            # train() (`trainer.args.max_steps = …`, a resume's new step count).
            arguments = self._described[0].merged(TrainingArguments.of(**_set_in(args)))
            self._described = (arguments, self._described[1])
            self._told_options = True
            self._tell_options(arguments)
        self._follow_batch_size(args, state)
        self._follow_checkpointing(kwargs.get("model"))
        self._follow_frozen(kwargs.get("model"))
        length = _sequence_length(kwargs.get("train_dataloader"))
        if length is not None and self._described is not None:
            arguments, model_name = self._described
            self.run.reporter.described({**arguments.to_dict(), "seq_len": length}, model_name)
        self._each("on_train_begin", args, state, control, **kwargs)
        from anatomy.engine.attach import Underway

        self.run.training_underway = Underway(
            threading.get_ident(), weakref.ref(trainer) if trainer is not None else None, state,
            _cuda_ooms())

    def _end_raised(self, underway: Underway) -> None:
        """A training that raised (out of memory, most often), the script having caught the
        error and built another Trainer: the run of the callback's own ends as failed (oom
        where CUDA's count of out-of-memory errors rose), and the new training gets a run of
        its own; the script's own run (anatomy.start()) goes on, the failure said in it.
        Before, the run went on as one: "completed", two trainings' steps in one count."""
        self.run.training_underway = None
        state = underway.state
        ooms = _cuda_ooms()
        oom = underway.ooms is not None and ooms is not None and ooms > underway.ooms
        words = (("CUDA ran out of memory: " if oom else "")
                 + f"the training stopped at step {state.global_step:,}"
                 + (f" of {state.max_steps:,}" if state.max_steps else "")
                 + " without ending (the Trainer raised an error that the script caught, then "
                   "trained another Trainer)")
        if not self.renews_run:
            self.run.reporter.tell(Level.WARNING, words)
            _say(f"run {self.run.id}: {words}")
            return
        self.run.end_as(Ending(Status.OOM if oom else Status.FAILED, words))

    def _follow_batch_size(self, args, state) -> None:
        """The batch the Trainer trains at, where it is not the arguments': with
        auto_find_batch_size, a training that runs out of memory is begun again at a smaller
        batch (accelerate's find_executable_batch_size, 10 % less each time), and a resume takes
        the batch its checkpoint found. The run is described, measured and predicted at that
        batch (it kept the first one's, its components partly the failed attempt's), and the
        lowering is said."""
        trained = _trained_batch_size(args, state)
        if trained is None or self._described is None:
            return
        arguments, model_name = self._described
        was = arguments.batch_size
        if was is None or trained == was:
            return
        self._redescribe(TrainingArguments.of(batch_size=trained))
        said = (f"the Trainer trains at batch {trained:,} a device: auto_find_batch_size lowered "
                f"it from {was:,} after an out-of-memory error; the run is measured and "
                f"predicted at {trained:,}")
        if not self.run.reporter.source.rank:  # said once for the run: rank 0's
            self.run.reporter.tell(Level.WARNING, said)
            _say(f"run {self.run.id}: {said}")
        if self._predicting is not None:  # predicted again, at the new batch
            self._predicting.end()
            self._predicting = None
        for index, callback in enumerate(self._callbacks):
            if isinstance(callback, ComponentProbing):  # measured again, at the new batch
                callback.probe.close()
                self._callbacks[index] = ComponentProbing(self.run.reporter, ComponentProbe(
                    callback.probe.model, callback.probe.use_cuda, trained))

    def _follow_checkpointing(self, model) -> None:
        """Checkpointing the script turned on itself (`model.gradient_checkpointing_enable()`)
        once the Trainer was built, before it trains: the run is described and predicted with
        it (its activations a fraction of a step's without)."""
        if self._described is None or not _checkpointed(model):
            return
        if not self._described[0].gradient_checkpointing:
            self._redescribe(TrainingArguments.of(gradient_checkpointing=True))

    def _follow_frozen(self, model) -> None:
        """Parameters the script froze once the Trainer was built, before it trains (the
        Trainer builds its optimizer over those that train as it begins): the run is described
        and predicted with them, its trained parameters counted again."""
        if self._described is None or model is None or _lora_options(model) is not None:
            return
        frozen = _frozen(model)
        if not frozen or frozen == self._described[0].frozen:
            return
        self.run.reporter.environment(RunFacts.of(
            trainable_parameters=models.trained_count(model)))
        self._redescribe(TrainingArguments.of(frozen=frozen))

    def _redescribe(self, changed: TrainingArguments) -> None:
        """The run described again with `changed` over what the Trainer's arguments said (and
        the lengths read so far): its environment, and the options it is predicted with."""
        arguments, model_name = self._described
        arguments = arguments.merged(changed)
        self._described = (arguments, model_name)
        self._tell_options(arguments)

    def _tell_options(self, arguments: TrainingArguments) -> None:
        """The run's environment and options are `arguments` (and the lengths read so far)."""
        self.run.reporter.environment(RunFacts(training_arguments=arguments))
        self.run.reporter.described({**arguments.to_dict(), **(
            _lengths_said(self._lengths) if self._lengths is not None else {})},
            self._described[1])

    def _describe_evaluation(self, args) -> None:
        """The Trainer evaluates (or predicts) before it has trained: the run's options are the
        evaluation's, its batch per_device_eval_batch_size, with none of the training's alone
        (its batch, accumulation, optimizer, steps), which it never ran: those told at the
        Trainer's init are dropped. A training the run holds already (another
        Trainer's) keeps the run's options."""
        if self._told_options or self._described is None or self.run.ended \
                or Phase.TRAINING in self.run.reporter.begun:
            return
        self._told_options = True
        arguments, model_name = self._described
        evaluating = _evaluating(arguments, args.per_device_eval_batch_size)
        kept = evaluating.to_dict()
        self.run.reporter.environment(RunFacts(training_arguments=evaluating))
        self.run.reporter.described(kept, model_name, dropped=tuple(
            name for name in arguments.to_dict() if name not in kept))

    def _tell_order(self, args) -> None:
        """A callback given in `callbacks=[…]` comes after report_to's integrations, which have
        logged each log before it adds its figures: said once, with what puts it first."""
        trackers = [name for name in (getattr(args, "report_to", None) or []) if name != "none"]
        if self._handler is not None or self._told_order or not trackers:
            return
        self._told_order = True
        _say(f"report_to's {', '.join(trackers)} come before the Trainer's callbacks and log "
             "without anatomy's figures: `anatomy.AnatomyCallback.attach(trainer)` (in place of "
             "callbacks=[AnatomyCallback()]) puts them in their logs")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not self._records(state):
            return
        self._each("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if not self._records(state):
            return
        self._each("on_optimizer_step", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if not self._records(state):
            return
        self._each("on_step_end", args, state, control, **kwargs)
        self._describe_longest()
        if self._predicting is None and self.predict and self._predictable:
            self._predict()

    def _predict(self) -> None:
        """The predicted peak, worked out beside the training (engine/predicting.py) from the
        first step on, whose batch's sequence length the prediction is made at: the figures
        carry it once it is known. Rank 0's alone (the figures are the run's); none where
        nothing records the run. One that cannot be made is said in one line."""
        run = self.run
        locator = run.store_locator()
        if run.reporter.source.rank or run.id is None or locator is None:
            return
        refused = libraries.refusal()  # the prediction mirrors the declared Trainer's modules
        if refused is not None:
            self._predictable = False  # said once; the run is recorded all the same
            _say(f"run {run.id}: no predicted peak for the Trainer's logs: {refused}")
            return

        def answered(answer: Answer) -> None:
            if answer.peak is not None:
                run.reporter.predicted(answer.peak)
            else:
                _say(f"run {run.id}: no predicted peak for the Trainer's logs: {answer.why}")

        longest = self._lengths.longest if self._lengths is not None else None
        self._predicting = Predicting(locator, run.id, longest, answered)

    def _describe_longest(self) -> None:
        """The run's sequence length is the longest batch trained on so far (the first
        example's until a step has one): the peak's activations are made at it. Rank 0 says it
        for a run of several processes."""
        lengths, described = self._lengths, self._described
        if lengths is None or described is None or self.run.reporter.source.rank:
            return
        said = _lengths_said(lengths)  # an encoder-decoder's target length with it
        if not said or said == self._longest_said:
            return
        self._longest_said = said
        arguments, model_name = described
        self.run.reporter.described({**arguments.to_dict(), **_lengths_said(lengths)}, model_name)

    def on_log(self, args, state, control, **kwargs):
        if not self._records(state):
            return
        self._each("on_log", args, state, control, **kwargs)
        logs = kwargs.get("logs")
        if isinstance(logs, dict) and self._reader is not None and not self._logging:
            logs.update(self._reader.take())

    def _log_last(self, args, state, control, training_ended: bool) -> None:
        """The training phase ends after the Trainer's last log: its memory, and what else came
        since that log, reach the integrations in a log of their own, before they close."""
        figures = self.run.figures()
        if self._reader is None or self._handler is None or figures is None:
            return
        if training_ended:
            figures.wait_for_phase(Phase.TRAINING, self.run.reporter.last_mark,
                                   LAST_FIGURES_WAIT)
        last = self._reader.take()
        if last:
            self._logging = True
            try:
                self._handler.on_log(args, state, control, last)
            finally:
                self._logging = False

    def on_evaluate(self, args, state, control, **kwargs):
        self._did_also(UNTRAINED["evaluate"], args, state)

    def on_predict(self, args, state, control, **kwargs):
        self._did_also(UNTRAINED["predict"], args, state)

    def _did_also(self, did: tuple[str, str], args, state) -> None:
        """What the Trainer did, for `_untrained`: this callback's Trainer, into a run going on
        (an evaluation after the training's run ended is no part of it). Its options are the
        evaluation's where no forward of its model told them (a Trainer given `model_init`)."""
        if getattr(state, "_anatomy_callback", None) not in (None, id(self)) or self.run.ended:
            return
        if did not in self._did:
            self._did.append(did)
        self._describe_evaluation(args)

    def _untrained(self, ending: Ending) -> None:
        """As the run ends (Run.on_end): a run that completed with no training phase says why,
        where its Trainer never trained (it only evaluated, or only was built): it was
        "completed" with a weights phase alone, and said nothing. Rank 0 says it for the run."""
        reporter = self.run.reporter
        if ending.status != Status.COMPLETED or Phase.TRAINING in reporter.begun \
                or reporter.source.rank:
            return
        if self._did:
            words = (f"no training phase: the Trainer {' and '.join(d for d, _ in self._did)} and"
                     " never trained (no trainer.train()); the memory after its weights phase is"
                     f" the {' and '.join(what for _, what in self._did)}'s")
        else:
            words = ("no training phase: the Trainer was built and never trained (no "
                     "trainer.train())")
        reporter.tell(Level.WARNING, words)
        _say(f"run {self.run.id}: {words}")

    def on_train_end(self, args, state, control, **kwargs):
        if not self._records(state):
            return
        training = self.run.reporter.open_phase == Phase.TRAINING
        self.run.training_underway = None
        self._each("on_train_end", args, state, control, **kwargs)
        self._log_last(args, state, control, training)
        if self._predicting is not None:
            self._predicting.end()  # not answered yet: it ends with the training
            self._predicting = None
        runtime = next((entry.get("train_runtime") for entry in reversed(state.log_history)
                        if "train_runtime" in entry), None)
        last = state.log_history[-1] if state.log_history else {}
        self.run.reporter.summary(TrainingSummary.of(
            steps=state.global_step, time_s=runtime,
            samples_per_second=last.get("train_samples_per_second"), loss=last.get("train_loss")))
        if self.owns_run:
            self.run.end()


def _say(text: str) -> None:
    """A line to the user's terminal, as their script prints (beside the Trainer's progress
    bar, not glued to it)."""
    from anatomy.engine.attach import say

    say(f"anatomy: {text}")


def _set_in(args) -> dict[str, Any]:
    """The run's options the Trainer's arguments alone decide (not the model, not an optimizer
    the script gave it): read as it is built, and again as it trains."""
    return {"batch_size": args.per_device_train_batch_size,
            "grad_accum": args.gradient_accumulation_steps,
            "precision": Precision.BF16 if args.bf16 else Precision.FP16 if args.fp16
            else Precision.FP32,
            "seed": args.seed, "max_steps": args.max_steps if args.max_steps > 0 else None,
            "epochs": args.num_train_epochs}


def _training_facts(args, model, of_a_launch: bool = False, trainer=None,
                    optimizer=None) -> RunFacts:
    """What the run's environment keeps of the user's training: the options anatomy knows by
    name (from TrainingArguments), the model, a step of the user's own (`trainer`'s) and the
    optimizer the script gave it (`optimizer`). `of_a_launch`: the run records a launch's
    ranks (Run.of_a_launch)."""
    checkpointing = getattr(args, "gradient_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(args, "activation_checkpointing", False)
    checkpointing = checkpointing or _checkpointed(model)
    given_optim, optimizer_left = _given_optimizer(optimizer, trainer, model)
    said = _set_in(args)
    arguments = TrainingArguments.of(
        batch_size=said["batch_size"], grad_accum=said["grad_accum"],
        precision=said["precision"], gradient_checkpointing=bool(checkpointing),
        optim=given_optim or str(getattr(args.optim, "value", args.optim)), seed=said["seed"],
        max_steps=said["max_steps"], epochs=said["epochs"])
    # Under `anatomy watch` (or on several hosts, each host's part), the processes launched,
    # where the Trainer counts fewer: torchrun on CPU ranks leaves each rank's Trainer
    # undistributed (world size 1), yet the run records every rank (every host's), and a world
    # size of 1 would hide all but rank 0's from the reports. Else only rank 0 records (its own
    # processes, on the CPU): the Trainer's count stands.
    from anatomy.engine.attach import launched_world_size

    world_size = max(args.world_size, launched_world_size()) if of_a_launch else args.world_size
    if model is None:
        return RunFacts.of(training_arguments=arguments, world_size=world_size)
    lora = _lora_options(model)
    if lora is not None:
        arguments = arguments.merged(lora)
    frozen = _frozen(model) if lora is None else None
    if frozen:
        arguments = arguments.merged(TrainingArguments.of(frozen=frozen))
    held = _held_type(model)
    weights = Weights.of_torch(held)
    if weights is not None:  # fp32, or a model loaded in bf16; another type is left out
        arguments = arguments.merged(TrainingArguments.of(weights=weights))
    # peft wraps the user's model: the architecture is the base model's, the rank the adapters'
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # Eager attention alone is recorded: another (flash attention, flex) is predicted as
    # sdpa, whose kernels keep what flash attention keeps.
    if getattr(getattr(base, "config", None), "_attn_implementation", None) == "eager":
        arguments = arguments.merged(TrainingArguments.of(attention=Attention.EAGER))
    smoothing = getattr(args, "label_smoothing_factor", 0) or 0
    # Trainer.__init__ drops the smoother for a multi-label classifier (its labels are no class)
    if smoothing and getattr(getattr(base, "config", None), "problem_type",
                             None) != "multi_label_classification":
        arguments = arguments.merged(TrainingArguments.of(label_smoothing=float(smoothing)))
    return RunFacts.of(
        training_arguments=arguments, world_size=world_size,
        parameters=sum(p.numel() for p in model.parameters()),
        trainable_parameters=models.trained_count(model),
        left_out=(_adapter_left_out(model) + _trainer_left_out(args, held)
                  + _step_left_out(trainer) + optimizer_left + _compiled(model)
                  + (_frozen_left_out(model) if lora is None else [])) or None,
    ).merged(carried_model.trained(getattr(model, "config", None), type(base).__name__,
                                   _transformers_class(base)))


def _transformers_class(model) -> str | None:
    """transformers' class that the model is or derives from (a script's own subclass of
    LlamaForCausalLM: LlamaForCausalLM); None for a model of no transformers class."""
    return next((cls.__name__ for cls in type(model).__mro__
                 if cls.__module__.startswith("transformers.models.")), None)


# What an evaluation or a prediction runs with of the Trainer's arguments: how the model is held
# and computes. The rest (the training's batch, accumulation, checkpointing, optimizer, seed,
# steps, what trains) is the training's alone.
_EVALUATED = ("precision", "weights", "attention", "lora_rank", "lora_targets", "lora_dropout")


def _evaluating(arguments: TrainingArguments, batch_size: int | None = None) -> TrainingArguments:
    """`arguments` as an evaluation runs them, at `batch_size` (where known): _EVALUATED's."""
    given = arguments.to_dict()
    return TrainingArguments.of(**({"batch_size": batch_size} if batch_size else {}),
                                **{name: given[name] for name in _EVALUATED if name in given})


def _lengths_said(lengths: BatchLengths) -> dict[str, int]:
    """The run's sequence length, and an encoder-decoder's target length, as far as read."""
    said = {"seq_len": lengths.longest} if lengths.longest is not None else {}
    return {**said, "target_len": lengths.target} if lengths.target is not None else said


def _frozen(model) -> str | None:
    """What the script froze itself (requires_grad=False: its embeddings, a vision tower, the
    lower layers), by the largest modules wholly frozen, comma-separated as a run stores it;
    None where it froze nothing, or more pieces than a run records (the prediction then says
    it trained fewer parameters than it predicts)."""
    names = models.frozen_names(model)
    return ",".join(names) if 0 < len(names) <= models.MAX_FROZEN_NAMES else None


def _checkpointed(model) -> bool:
    """Whether a model recomputes its layers' activations in the backward pass: turned on by
    the Trainer's argument or by the script itself (`model.gradient_checkpointing_enable()`,
    as QLoRA's recipes do before peft wraps it). transformers 5 names it activation
    checkpointing (its older name warns)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(base), name):
            return bool(getattr(base, name))
    return False


def _trained_batch_size(args, state) -> int | None:
    """The per-device batch the Trainer's training loop runs at (its state's, which
    auto_find_batch_size lowers; over DataParallel's GPUs of one process, each one's share);
    None where the state does not say."""
    total = getattr(state, "train_batch_size", None)
    if not isinstance(total, int) or total < 1:
        return None
    return max(1, total // max(1, getattr(args, "n_gpu", 1) or 1))


def _lora_options(model) -> TrainingArguments | None:
    """A peft LoRA model's rank and target modules (where its targets are a pattern, the modules
    peft wrapped: `_wrapped`); None for a model without LoRA."""
    adapters = getattr(model, "peft_config", None)
    adapter = next(iter(adapters.values()), None) if isinstance(adapters, dict) else None
    rank = getattr(adapter, "r", None)
    if not isinstance(rank, int) or rank <= 0:
        return None
    targets = getattr(adapter, "target_modules", None)
    names = sorted(targets) if isinstance(targets, (set, list, tuple)) else _wrapped(model)
    dropout = getattr(adapter, "lora_dropout", 0.0)
    return TrainingArguments.of(lora_rank=rank, lora_targets=",".join(names),
                                lora_dropout=float(dropout) if isinstance(dropout, (int, float))
                                and not isinstance(dropout, bool) else None)


# peft's LoRA settings that change what training holds beyond the rank, the targets and the
# dropout, which the prediction builds (analysis/models/lora.py), each with whether the user's
# value is other than the prediction's (peft's default): DoRA's magnitudes and weight norms,
# trained biases, ranks by layer, some layers alone, parameters or token rows as targets.
_ADAPTER_SETTINGS = (
    ("use_dora", bool), ("bias", lambda v: v not in (None, "none")), ("lora_bias", bool),
    ("rank_pattern", bool), ("layers_to_transform", lambda v: v is not None),
    ("target_parameters", bool), ("trainable_token_indices", bool), ("layer_replication", bool),
)


def _adapter_left_out(model) -> list[str]:
    """What a peft model's adapters hold or do that the prediction's LoRA does not, each as the
    setting that does it ("use_dora=True"): another kind of adapter (LoHa, IA3…), several
    adapters, a LoRA setting beyond the rank, the targets and the dropout, modules saved whole
    beside a classifier's head. Empty for a plain LoRA, or a model without adapters."""
    adapters = getattr(model, "peft_config", None)
    if not isinstance(adapters, dict) or not adapters:
        return []
    left = [f"{len(adapters)} adapters"] if len(adapters) > 1 else []
    adapter = next(iter(adapters.values()))
    kind = str(getattr(getattr(adapter, "peft_type", None), "value", "") or "")
    if kind != "LORA":
        return [*left, f"peft_type={kind or type(adapter).__name__}"]
    for name, differs in _ADAPTER_SETTINGS:
        value = getattr(adapter, name, None)
        if differs(value):
            left.append(f"{name}={value!r}")
    saved = sorted(getattr(adapter, "modules_to_save", None) or ())
    if saved and not _classifier_head(model, saved):
        left.append(f"modules_to_save={saved!r}")
    return left


# The Trainer's arguments that change what a step holds, which the prediction's step does not
# do (a compiled graph, fused kernels, noise on the embeddings), each with whether the user's
# value does it.
_TRAINER_SETTINGS = (
    ("torch_compile", bool), ("use_liger_kernel", bool),
    ("neftune_noise_alpha", lambda v: v is not None),
)


def _trainer_left_out(args, held: str | None) -> list[str]:
    """What a user's Trainer does that the prediction's step does not, each as the argument
    that does it ("torch_compile=True"), and weights held (`held`: `_held_type`'s) in a
    type the prediction does not build (fp16 throughout)."""
    left = []
    if held is not None and Weights.of_torch(held) is None:
        left.append(f"weights in {held}, not float32 or bfloat16")
    for name, does in _TRAINER_SETTINGS:
        value = getattr(args, name, None)
        if does(value):
            left.append(f"{name}={value!r}")
    return left


# The Trainer's methods that make a step (its loss and gradients) and the optimizer it steps:
# the prediction traces transformers' own (the model's loss or its label smoother; the
# optimizer the `optim` argument names).
_STEP_METHODS = ("compute_loss", "training_step", "create_optimizer")


def _step_left_out(trainer) -> list[str]:
    """A step of the user's own, which the prediction's step does not compute, each as what
    does it: a Trainer subclass's own method ("its own compute_loss, MyTrainer.compute_loss";
    a library's trainer's likewise, TRL's SFTTrainer.compute_loss; its own create_optimizer),
    a `compute_loss_func`. Empty for transformers' own step, or where the Trainer is not
    known."""
    if trainer is None:
        return []
    left = []
    for name in _STEP_METHODS:
        method = getattr(getattr(trainer, name, None), "__func__", None)
        if method is not None and not _of_transformers(method):
            left.append(f"its own {name}, {_named(method)}")
    loss = getattr(trainer, "compute_loss_func", None)
    if loss is not None:
        left.append(f"compute_loss_func={_named(loss)}")
    return left


def _given_optimizer(optimizer, trainer, model) -> tuple[str | None, list[str]]:
    """The optim name of an optimizer the script gave the Trainer (`optimizers=(…)`, or
    `optimizer_cls_and_kwargs`) where the Trainer builds one that holds the same (torch's
    AdamW is adamw_torch), over every trainable parameter; else what is left out of the
    prediction ("its own optimizer, SGD"). (None, []) where the Trainer builds its own."""
    if optimizer is None:
        declared = getattr(trainer, "optimizer_cls_and_kwargs", None)
        kind, settings = declared if isinstance(declared, tuple) and len(declared) == 2 \
            else (None, None)
        if not isinstance(kind, type):
            return None, []
    else:  # any object with a step (a library's wrapper has no torch defaults)
        kind, settings = type(optimizer), getattr(optimizer, "defaults", None)
    settings = dict(settings) if isinstance(settings, dict) else {}
    optim = _optim_of(kind, settings)
    if optim is None:
        said = ", ".join(f"{name}={settings[name]!r}" for name in _STATEFUL if settings.get(name))
        return None, [f"its own optimizer, {kind.__name__}{f'({said})' if said else ''}"]
    if optimizer is not None and model is not None:
        # A frozen parameter given to it has no gradient, so no state: over every parameter
        # of a LoRA model (AdamW(model.parameters())) it holds the adapters' alone.
        given = sum(p.numel() for group in getattr(optimizer, "param_groups", None) or ()
                    for p in group.get("params", ()) if p.requires_grad)
        trainable = models.trained_count(model)
        if given != trainable:
            return None, [f"its own optimizer over {given:,} of {trainable:,} trainable "
                          "parameters"]
    return optim, []


# An optimizer's settings that keep a state the Trainer's optimizer of that class does not.
_STATEFUL = ("momentum", "amsgrad", "centered")


def _optim_of(kind: type, settings: dict) -> str | None:
    """The Trainer's optim name that builds an optimizer holding what one of class `kind` with
    `settings` holds (its states): torch's AdamW, fused or not; SGD without momentum (the
    Trainer's holds no state); Adagrad; RMSprop without momentum, not centred; transformers'
    Adafactor. None for another (a momentum's buffer, amsgrad's maxima, a library's)."""
    optim = torch.optim
    if kind is optim.AdamW and not settings.get("amsgrad"):
        return "adamw_torch_fused" if settings.get("fused") else "adamw_torch"
    if kind is optim.SGD and not settings.get("momentum"):
        return "sgd"
    if kind is optim.Adagrad:
        return "adagrad"
    if kind is optim.RMSprop and not settings.get("momentum") and not settings.get("centered"):
        return "rmsprop"
    if kind.__name__ == "Adafactor" and _of_transformers(kind):
        return "adafactor"
    return None


def _named(function) -> str:
    """A function's name as its script reads it: "MyTrainer.compute_loss", without the
    function it was defined in."""
    return getattr(function, "__qualname__", type(function).__name__).split("<locals>.")[-1]


def _of_transformers(function) -> bool:
    """Whether `function` is transformers' own (Trainer's, Seq2SeqTrainer's…)."""
    return (getattr(function, "__module__", "") or "").split(".")[0] == "transformers"


def _calling_trainer():
    """The Trainer whose event this is, from the frames that call it: the Trainer hands its
    callbacks its model, optimizer and data loaders, never itself, and a callback given in
    `callbacks=[…]` has no other way to it. None where no Trainer's method is among them."""
    trainers = sys.modules.get("transformers.trainer")
    if trainers is None:
        return None
    frame = sys._getframe(1)
    for _ in range(_CALLING_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, trainers.Trainer):
            return owner
        frame = frame.f_back
    return None


# Frames from a callback's event up to the Trainer's method that fires it: the event, the
# handler's call_event and its event, Trainer.__init__ or its training loop, with room for
# wrappers (accelerate's find_executable_batch_size, a subclass's __init__).
_CALLING_FRAMES = 12


def _compiled(model) -> list[str]:
    """A model the script compiled itself (`torch.compile(model)`, `model.compile()`), whose
    graph keeps other activations than the eager step the prediction traces, as the argument
    that does it; empty for an eager model (the Trainer's own `torch_compile` is its
    argument's)."""
    for module in (model, getattr(model, "get_base_model", lambda: None)()):
        if module is not None and (hasattr(module, "_orig_mod") or
                                   getattr(module, "_compiled_call_impl", None) is not None):
            return ["torch.compile(model)"]
    return []


def _frozen_left_out(model) -> list[str]:
    """A speech model's feature encoder the script froze by requires_grad alone (not with
    `freeze_feature_encoder()`, as the prediction freezes it): its input still asks a gradient,
    and its activations are kept. Under LoRA the prediction's encoder asks it too (peft freezes
    by requires_grad), and nothing is said."""
    return [f"{name} frozen by requires_grad alone, not freeze_feature_encoder() (its input "
            "still asks a gradient)" for name in models.frozen_asking_gradients(model)]


def _held_type(model) -> str | None:
    """The type most of a model's weights are held in, by torch's name ("bfloat16" for a model
    loaded with dtype=torch.bfloat16); None without a model, or for a quantized one (predicted
    unquantized, as the pages say)."""
    if model is None or getattr(getattr(model, "config", None), "quantization_config",
                                None) is not None:
        return None
    kinds: dict[str, int] = {}
    for parameter in model.parameters():
        kind = str(parameter.dtype).removeprefix("torch.")
        kinds[kind] = kinds.get(kind, 0) + parameter.numel()
    return max(kinds, key=kinds.get) if kinds else None


def _classifier_head(model, names: list[str]) -> bool:
    """Whether the modules a peft model saves whole are its classification head alone, which
    the prediction's LoRA trains whole too: a classifier's (its class a …ForXClassification)
    own layers beside its backbone, each a child of the model but its largest (the backbone:
    a BERT's pooler, inside it, is no head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not re.search(r"For\w*Classification$", type(base).__name__):
        return False
    children = dict(base.named_children())
    if not children:
        return False
    backbone = max(children, key=lambda n: sum(p.numel() for p in children[n].parameters()))
    return all(name in children and name != backbone for name in names)


def _wrapped(model) -> list[str]:
    """The modules a pattern of target modules (a regular expression) made LoRA layers, as peft
    matches target names: a module's own name where every module of that name is wrapped (each
    layer's gate_proj), else its whole name (the first layer's alone). Empty where peft does not
    say (before peft kept `targeted_module_names`): the architecture's targets are assumed."""
    wrapped = set(getattr(getattr(model, "base_model", None), "targeted_module_names", None)
                  or ())
    if not wrapped or not hasattr(model, "get_base_model"):
        return []
    every: dict[str, set[str]] = {}
    for name, _ in model.get_base_model().named_modules():
        every.setdefault(name.rsplit(".", 1)[-1], set()).add(name)
    names = set()
    for name in wrapped:
        last = name.rsplit(".", 1)[-1]
        names.add(last if every.get(last, set()) <= wrapped else name)
    return sorted(names)


def _sequence_length(dataloader) -> int | None:
    """The tokens of the training set's first example, where the set can be indexed: the
    sequence length a prediction needs, which TrainingArguments do not say. Reads one example;
    draws no batch (the training's order and randomness are untouched). With padding per batch
    it is the first example's own length."""
    try:
        ids = dataloader.dataset[0]["input_ids"]
        length = len(ids)
    except Exception:  # noqa: BLE001 - an iterable or custom dataset: the length stays unknown
        return None
    return length if isinstance(length, int) and length > 0 else None
