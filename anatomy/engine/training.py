"""The training of one process: the walkthrough's kernel, weights and training phases on its
device, each marked as it begins and as it ends, through a `Reporter`.

The worker (engine/worker.py) runs it in its own process; a run of several processes runs it in
each rank (engine/ranks.py). It imports torch inside its functions only: the worker measures its
baseline before torch is loaded.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.data import Tokenized
from anatomy.analysis.models import ModelSpec
from anatomy.analysis.options import RunOptions
from anatomy.engine.endings import is_oom
from anatomy.engine.reporter import Reporter
from anatomy.store import RunFacts, TrainingSummary
from anatomy.vocabulary import Level, Phase, Precision, Status

EXIT_OOM = 3
EXIT_FAILED = 1
EXIT_PEER_LOST = 4  # a rank whose collective lost another rank: the other's end is the cause

# How a collective says that another rank is gone: gloo's TCP pair, NCCL's remote error.
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer",
              "remote process exited or there was a network error")


def progress_bars_lock() -> None:
    """tqdm guards its bars with a multiprocessing lock, here a named semaphore that a killed
    worker cannot unlink (the resource tracker then warns when the CLI exits). The worker's bars
    are its own: a thread lock does."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def dummy_dataset(options: RunOptions, spec: ModelSpec):
    """The walkthrough's random data, shaped for the model's head (engine/dataset.py)."""
    from anatomy.engine.dataset import DummyDataset

    return DummyDataset(spec, options.samples, options.seq_len, options.seed, options.target_len)


def text_dataset(options: RunOptions, spec: ModelSpec, tokenized: Tokenized):
    """A dataset's texts as analysis/data.py tokenized them (engine/dataset.py)."""
    from anatomy.engine.dataset import TextDataset

    return TextDataset(spec, tokenized, options.seed)


def _sharding(options: RunOptions, model=None) -> dict:
    """TrainingArguments for several processes: the strategy's (anatomy/strategies/)."""
    if not options.distributed:
        return {}
    return strategies.named(options.strategy).training_arguments(model)


def training_arguments(options: RunOptions, output_dir: str, use_cuda: bool, model=None):
    from transformers import TrainingArguments

    # transformers 5.2x renamed gradient_checkpointing; older 5.x only knows the old name.
    checkpointing = ("activation_checkpointing"
                     if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                     else "gradient_checkpointing")
    return TrainingArguments(
        # The walkthrough's default_args, but for evaluation: its "steps" without an evaluation
        # dataset never evaluated (its 128 steps end before eval_steps, 500), and transformers
        # now refuses it; "no" is what it did.
        output_dir=output_dir, eval_strategy="no", num_train_epochs=options.epochs,
        log_level="error", report_to="none",
        # The run's options:
        per_device_train_batch_size=options.batch_size,
        gradient_accumulation_steps=options.grad_accum,
        **{checkpointing: options.gradient_checkpointing},
        fp16=options.precision == Precision.FP16, bf16=options.precision == Precision.BF16,
        optim=options.optim.value, seed=options.seed,
        label_smoothing_factor=options.label_smoothing,
        max_steps=options.max_steps if options.max_steps is not None else -1,
        # Ours: no checkpoints (the walkthrough's 128 steps never reach save_steps=500 either),
        # our own progress bar, and a loss every step for the chart.
        save_strategy="no", disable_tqdm=True, logging_steps=1, use_cpu=not use_cuda,
        **_sharding(options, model),
    )


def _trainer(model, dataset, options: RunOptions, output_dir: str, use_cuda: bool,
             callbacks: list):
    """The walkthrough's Trainer."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    arguments = training_arguments(options, output_dir, use_cuda, model)
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, callbacks=callbacks,
                      data_collator=dataset.collator())
    trainer.remove_callback(PrinterCallback)  # it prints every step's log; we draw our own
    return trainer


def _profile(reporter: Reporter, model, dataset, trainer, options: RunOptions, device: str) -> None:
    """Profile a few more steps on one batch, after training (the training phase stays pure)."""
    from anatomy.engine.profiler import profile_steps

    steps = options.profile_steps
    reporter.tell(Level.INFO, f"profiling {steps} training steps with torch.profiler")
    # Marked, so that the run's peak leaves the profiler's own buffers out and the chart names them.
    reporter.begin(Phase.PROFILING)
    batch = dataset.batch(options.batch_size)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # unwrap accelerate's
    profile = profile_steps(model, batch, steps=steps, device=device, optimizer=optimizer,
                            precision=options.precision)
    reporter.end(Phase.PROFILING)
    reporter.operations(profile.to_dict())


def _callbacks(reporter: Reporter, model, use_cuda: bool, batch_size: int) -> list:
    """The worker's Trainer callbacks (engine/callbacks.py), in the order they run."""
    from anatomy.engine.callbacks import (
        ComponentProbing,
        FaultInjection,
        PhaseMarks,
        StepReports,
    )
    from anatomy.engine.probe import ComponentProbe

    steps = StepReports(reporter, use_cuda)
    callbacks = [steps, PhaseMarks(reporter),
                 ComponentProbing(reporter, ComponentProbe(model, use_cuda, batch_size))]
    fault = FaultInjection.from_environment(steps)
    return callbacks + ([fault] if fault else [])


# The Trainer's output folder's prefix in the temporary directory.
OUTPUT_PREFIX = "anatomy-"


@contextmanager
def output_folder(given: str | None) -> Iterator[str]:
    """The Trainer's output folder (it saves nothing there: save_strategy "no"): `given`, made
    and removed by whoever outlives the training process (the manager: a process killed never
    removes its own), else one of this process's, removed as it returns (an in-process caller:
    the bench, the tests)."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=OUTPUT_PREFIX) as own:
        yield own


def train_phases(reporter: Reporter, options: RunOptions, spec: ModelSpec, dataset, use_cuda: bool,
                 local_rank: int | None = None, output_dir: str | None = None) -> int:
    """The kernel, weights and training phases of one training process (a rank of several, or
    the only one); 0 when it trained. `output_dir`: the Trainer's (`output_folder`)."""
    import torch  # the kernel phase: torch's runtime (and on a GPU the CUDA context) loads

    device = "cuda" if use_cuda else "cpu"
    if use_cuda and local_rank is not None:  # a rank of several: its own GPU (cuda:LOCAL_RANK)
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    torch.ones((1, 1)).to(device)  # the walkthrough's first tensor: the CUDA context alone
    if use_cuda:
        torch.cuda.synchronize()
    reporter.hold(Phase.KERNEL)

    import transformers
    from transformers import logging

    logging.set_verbosity_error()
    # Allocated on the device itself, as a copy there would allocate them, and read so: the
    # weights alone, as the walkthrough reads them (a 1 B model in seconds, no copy through the
    # host). Random values are given after the reading: CUDA loads the initialisers' kernels
    # (about 90 MiB on an H200) as they first run, which belongs to no phase the walkthrough
    # reads but training's.
    try:
        model, weights_source = models.build_model(spec, device, lora_rank=options.lora_rank,
                                                   lora_targets=options.lora_targets,
                                                   lora_dropout=options.lora_dropout,
                                                   weights=options.weights,
                                                   attention=options.attention,
                                                   frozen=options.frozen,
                                                   initialise=False)
    except Exception as error:
        where = models.where_it_stopped(error)
        if not where or is_oom(error):  # not the model's own code refusing its config
            raise
        raise models.cannot_build(spec.display_name, error) from None
    if use_cuda:
        torch.cuda.synchronize()
    reporter.hold(Phase.WEIGHTS)
    if weights_source == models.RANDOM_WEIGHTS:
        models.initialise(model)
        held = models.unread_weights(spec)
        if held and reporter.source.rank in (0, None):  # a user's own checkpoint: said, once
            reporter.tell(Level.INFO, f"{spec.display_name} holds weights ({held}): anatomy "
                                      "trains random weights of its config, which take the same "
                                      "memory; its loss is not your checkpoint's")

    if reporter.source.rank in (0, None):  # one environment per run: rank 0's
        reporter.environment(RunFacts.of(
            # str(): torch's version is a TorchVersion, and unpickling one imports torch in the
            # collector's process (seconds of stall, hundreds of MB in the CLI or the server).
            torch=str(torch.__version__),
            torch_cuda=torch.version.cuda,
            transformers=transformers.__version__,
            device_name=torch.cuda.get_device_name(device) if use_cuda else "CPU",
            weights=weights_source,
            attention=getattr(model.config, "_attn_implementation", None),
            parameters=sum(p.numel() for p in model.parameters()),
            trainable_parameters=models.trained_count(model),
            model=spec.display_name,
            model_source=spec.source,
            task=spec.task,
            image_size=spec.image_size,
        ))
    callbacks = _callbacks(reporter, model, use_cuda, options.batch_size)
    with output_folder(output_dir) as folder:
        trainer = _trainer(model, dataset, options, folder, use_cuda, callbacks)
        if options.distributed and not reporter.source.rank:  # how accelerate shares the work
            plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
            reporter.environment(RunFacts.of(
                distributed_type=str(trainer.accelerator.distributed_type),
                fsdp_version=getattr(plugin, "fsdp_version", None) if plugin else None))
        result = trainer.train()
    if options.profile_steps:
        _profile(reporter, model, dataset, trainer, options, device)
    reporter.summary(TrainingSummary.of(
        # The Trainer's samples/s counts every rank's samples (its batch size is per device
        # times the world size): the run's global throughput, the same on every rank.
        time_s=result.metrics["train_runtime"],
        samples_per_second=result.metrics["train_samples_per_second"],
        steps=result.global_step,
        loss=result.training_loss,
    ))
    return 0


def guarded(reporter: Reporter, work, who: str = "") -> int:
    """Run `work()`; a failure is reported (the open phase ended where it failed, before memory
    is let go) and becomes the exit status. `who` names a rank of several in the error."""
    try:
        return work()
    except BaseException as error:  # noqa: BLE001 - every failure is reported, then re-judged
        oom = is_oom(error)
        if reporter.open_phase:
            reporter.end(reporter.open_phase)
        # A model its config cannot make is the user's input, told in its one line.
        text = str(error) if oom or isinstance(error, models.ModelError) else \
            traceback.format_exc()
        after_peer = bool(who) and not oom and lost_peer(error)
        reporter.failure(Status.OOM if oom else Status.FAILED, f"{who}: {text}" if who else text,
                         after_peer=after_peer)
        return EXIT_OOM if oom else EXIT_PEER_LOST if after_peer else EXIT_FAILED


def lost_peer(error: BaseException) -> bool:
    """A collective that failed because another rank is gone (killed, crashed): torch's network
    error, or the backend's own words in a RuntimeError. Not every backend error: an NCCL error
    of the rank's own is its own cause."""
    import torch.distributed as dist

    network = getattr(dist, "DistNetworkError", ())
    return isinstance(error, RuntimeError) and (
        isinstance(error, network) or any(words in str(error) for words in _PEER_LOST))
