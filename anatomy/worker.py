"""The training worker: the walkthrough's steps, each phase marked as it begins and as it ends.

Runs in a spawned process (never forked). It imports torch only after the baseline mark, so the
baseline is measured before any CUDA call (without a GPU: before torch is loaded).

Messages it puts on the queue:
  ("phase", name, t)            a phase begins: baseline, kernel, weights, training
  ("phase_end", name, t)        it ends: the next step begins (its memory is read here)
  ("step", (t, step, total, loss, allocated, reserved))
  ("environment", {...})        versions, device, attention implementation
  ("message", level, text, t)   things the user should know (e.g. the eval_strategy fallback)
  ("components", {...})         measured memory components of the first steps (bytes)
  ("operations", {...})         the operation classes of a profiled step, when asked for
  ("summary", {...})            time_s, samples_per_second, steps, loss
  ("error", status, text)       status "oom" or "failed"
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback

from anatomy.components import MEASURED_STEPS, ComponentProbe

INJECT_ENV = "ANATOMY_INJECT"  # tests only: "oom@STEP" or "crash@STEP"
EXIT_OOM = 3
EXIT_FAILED = 1


class _Messenger:
    def __init__(self, queue, t0: float, dwell: float):
        self.queue, self.t0, self.dwell = queue, t0, dwell

    def now(self) -> float:
        return time.monotonic() - self.t0

    open_phase: str | None = None

    def begin(self, name: str) -> None:
        self.queue.put(("phase", name, self.now()))
        self.open_phase = name

    def end(self, name: str) -> None:
        self.queue.put(("phase_end", name, self.now()))
        self.open_phase = None

    def hold(self, name: str) -> None:
        """A state between two steps: begun, held a few sample periods (so the sampler sees it
        even on a tiny model), ended as the next step begins."""
        self.begin(name)
        time.sleep(self.dwell)
        self.end(name)

    def send(self, *message) -> None:
        self.queue.put(message)

    def tell(self, level: str, text: str) -> None:
        self.queue.put(("message", level, text, self.now()))


def _dummy_dataset(options: dict):
    """The walkthrough's dataset: random token ids in [100, 30000), binary labels."""
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(options["seed"])
    size, length = options["dataset_size"], options["seq_len"]
    data = {
        "input_ids": rng.integers(100, 30000, (size, length)),
        "labels": rng.integers(0, 2, (size,)),
    }
    return Dataset.from_dict(data)  # set_format("pt") imports torch: the caller does it later


def _is_oom(error: BaseException) -> bool:
    import torch

    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def _training_arguments(options: dict, output_dir: str, use_cuda: bool, eval_strategy: str):
    from transformers import TrainingArguments

    # transformers 5.2x renamed gradient_checkpointing; older 5.x only knows the old name.
    checkpointing = ("activation_checkpointing"
                     if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                     else "gradient_checkpointing")
    return TrainingArguments(
        # The walkthrough's default_args:
        output_dir=output_dir, eval_strategy=eval_strategy, num_train_epochs=options["epochs"],
        log_level="error", report_to="none",
        # The run's options:
        per_device_train_batch_size=options["batch_size"],
        gradient_accumulation_steps=options["grad_accum"],
        **{checkpointing: options["gradient_checkpointing"]},
        fp16=options["precision"] == "fp16", bf16=options["precision"] == "bf16",
        optim=options["optim"], seed=options["seed"],
        max_steps=options["max_steps"] if options["max_steps"] is not None else -1,
        # Ours: no checkpoints (the walkthrough's 128 steps never reach save_steps=500 either),
        # our own progress bar, and a loss every step for the chart.
        save_strategy="no", disable_tqdm=True, logging_steps=1, use_cpu=not use_cuda,
    )


def _trainer(model, dataset, options: dict, output_dir: str, use_cuda: bool, callback,
             messenger: _Messenger):
    """The walkthrough's Trainer; eval_strategy "no" where transformers refuses "steps"."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    def build(eval_strategy: str):
        arguments = _training_arguments(options, output_dir, use_cuda, eval_strategy)
        trainer = Trainer(model=model, args=arguments, train_dataset=dataset, callbacks=[callback])
        trainer.remove_callback(PrinterCallback)  # it prints every step's log; we draw our own
        return trainer

    try:
        return build("steps")
    except ValueError as error:
        if "eval" not in str(error).lower():
            raise
        messenger.tell("warning",
                       "eval_strategy 'steps' needs an evaluation dataset and the walkthrough "
                       "trains without one; this transformers version refuses that, so the run "
                       "uses eval_strategy 'no' (nothing is evaluated either way)")
        return build("no")


def _make_callback(messenger: _Messenger, use_cuda: bool, inject: tuple[str, int] | None,
                   probe: ComponentProbe):
    import torch
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        """Marks the training phase and reports every step with its loss and the allocator's
        figures. The Trainer logs a step's loss just after on_step_end, so a step is sent from
        on_log (or, if nothing is logged, at the next step)."""

        pending: tuple | None = None

        def _flush(self, loss: float | None = None) -> None:
            if self.pending is not None:
                messenger.send("step", (*self.pending, loss, *self.memory))
                self.pending = None

        def on_train_begin(self, args, state, control, **kwargs):
            messenger.begin("training")

        def on_train_end(self, args, state, control, **kwargs):
            self._flush()
            messenger.end("training")
            self._components()

        def _components(self) -> None:
            if probe.forwards:  # measured at least one step, and not sent yet
                probe.close()
                messenger.send("components", probe.result())
                probe.forwards = 0

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step < MEASURED_STEPS:
                probe.before_optimizer_step()

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            if state.global_step < MEASURED_STEPS:
                probe.after_optimizer_step(optimizer)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == MEASURED_STEPS:
                self._components()
            self._flush()
            self.pending = (messenger.now(), state.global_step, state.max_steps)
            self.memory = ((torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
                           if use_cuda else (None, None))
            if inject and state.global_step >= inject[1]:
                self._flush()
                if inject[0] == "oom":
                    raise torch.cuda.OutOfMemoryError(
                        "CUDA out of memory. Tried to allocate 1.00 GiB (injected by "
                        f"{INJECT_ENV} for a test)")
                if inject[0] == "crash":
                    os._exit(9)  # dies without a word, as a killed worker would

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self._flush(float(logs["loss"]))

    return PhaseCallback()


def _profile(messenger: _Messenger, model, dataset, trainer, options: dict, device: str) -> None:
    """Profile a few more steps on one batch, after training (the training phase stays pure)."""
    from anatomy.operations import profile_steps

    steps = options["profile_steps"]
    messenger.tell("info", f"profiling {steps} training steps with torch.profiler")
    batch = dataset[: options["batch_size"]]
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # unwrap accelerate's
    profile = profile_steps(model, batch, steps=steps, device=device, optimizer=optimizer,
                            precision=options["precision"])
    messenger.send("operations", profile.to_dict())


def _parse_inject() -> tuple[str, int] | None:
    value = os.environ.get(INJECT_ENV)
    if not value:
        return None
    kind, _, step = value.partition("@")
    return kind, int(step or 1)


def train(queue, options: dict, t0: float, use_cuda: bool, dwell: float) -> int:
    messenger = _Messenger(queue, t0, dwell)
    messenger.begin("baseline")
    try:
        dataset = _dummy_dataset(options)
        time.sleep(dwell)
        messenger.end("baseline")

        import torch  # the kernel phase: torch's runtime (and on a GPU the CUDA context) loads

        device = "cuda" if use_cuda else "cpu"
        torch.ones((1, 1)).to(device)
        if use_cuda:
            torch.cuda.synchronize()
        dataset.set_format("pt")  # host memory only; here so a CPU baseline holds no torch
        messenger.hold("kernel")

        import transformers
        from transformers import logging

        from anatomy.presets import build_model

        logging.set_verbosity_error()
        model, weights_source = build_model(options["preset"])
        model = model.to(device)
        if use_cuda:
            torch.cuda.synchronize()
        messenger.hold("weights")

        messenger.send("environment", {
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "device_name": torch.cuda.get_device_name(0) if use_cuda else "CPU",
            "weights": weights_source,
            "attention": getattr(model.config, "_attn_implementation", None),
            "parameters": sum(p.numel() for p in model.parameters()),
        })
        probe = ComponentProbe(model, use_cuda)
        with tempfile.TemporaryDirectory(prefix="anatomy-") as output_dir:
            callback = _make_callback(messenger, use_cuda, _parse_inject(), probe)
            trainer = _trainer(model, dataset, options, output_dir, use_cuda, callback, messenger)
            result = trainer.train()
        if options.get("profile_steps"):
            _profile(messenger, model, dataset, trainer, options, device)
        messenger.send("summary", {
            "time_s": result.metrics["train_runtime"],
            "samples_per_second": result.metrics["train_samples_per_second"],
            "steps": result.global_step,
            "loss": result.training_loss,
        })
        return 0
    except BaseException as error:  # noqa: BLE001 - every failure is reported, then re-judged
        oom = "torch" in sys.modules and _is_oom(error)
        if messenger.open_phase:  # the phase ends where it failed, before memory is let go
            messenger.end(messenger.open_phase)
        messenger.send("error", "oom" if oom else "failed",
                       str(error) if oom else traceback.format_exc())
        return EXIT_OOM if oom else EXIT_FAILED


def main(queue, options: dict, t0: float, cuda_device: str | None, dwell: float) -> None:
    """Process target. `cuda_device` is the CUDA_VISIBLE_DEVICES entry to train on, or None."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Hub is never needed: configs ship here
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_device  # before torch: cuda:0 is our GPU
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    code = train(queue, options, t0, cuda_device is not None, dwell)
    queue.close()
    queue.join_thread()  # everything we said reaches the collector before the exit status does
    sys.exit(code)
