"""The Trainer callback as a user's Trainer drives it: transformers' own CallbackHandler calling
the hooks in a Trainer's order around a real model's steps, in this process. What it reports is
heard on the run's link (a list here: no sampler, no store)."""

from __future__ import annotations

import time

import pytest

from anatomy.engine import protocol
from anatomy.engine.collector import options_over


class _Heard:
    """The run's link: what the training side sent, in order."""

    run_id = None

    def __init__(self) -> None:
        self.messages: list = []

    def put(self, message) -> None:
        self.messages.append(message)

    def stop(self, reason: str) -> None:
        pass

    def close(self, ending, held=None) -> None:
        pass

    def of(self, kind) -> list:
        return [m for m in self.messages if isinstance(m, kind)]


@pytest.fixture
def heard(monkeypatch):
    """A run of this process that the callbacks join, as after anatomy.start()."""
    from anatomy.engine import attach

    link = _Heard()
    monkeypatch.setattr(attach, "_current", attach.Run(link, time.monotonic(), dwell=0.0))
    return link


def test_a_callback_that_names_a_run_says_so_where_it_joins_the_scripts_own(monkeypatch,
                                                                            capsys):
    """`anatomy.start()` at the script's top, then `AnatomyCallback(name="fine-tune")`: the
    callback joins the script's run, and its name was dropped without a word. Said; a callback
    given nothing says nothing."""
    from anatomy.engine import attach
    from anatomy.engine.callbacks import AnatomyCallback

    link = _Heard()
    link.run_id = 7
    monkeypatch.setattr(attach, "_current", attach.Run(link, time.monotonic(), dwell=0.0))
    AnatomyCallback()
    assert capsys.readouterr().err == ""
    AnatomyCallback(name="fine-tune", sample_rate=500)
    assert capsys.readouterr().err == (
        "anatomy: AnatomyCallback(name='fine-tune', sample_rate=500): run 7 records this process "
        "already and is joined as it is, these not used: give them to anatomy.start()\n")


def _trainer(tmp_path, callbacks):
    """A Trainer's callback handler over a tiny model and its optimizer, its init ended."""
    import torch
    from transformers import TrainingArguments
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    handler = CallbackHandler(callbacks, model, None, optimizer, None)
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                  per_device_train_batch_size=4)
    control = TrainerControl()
    handler.on_init_end(arguments, TrainerState(), control)
    return handler, arguments, control


def _does(tmp_path, calls: list[str], rows: int) -> None:
    """A Trainer with the callback that then does each of `calls` ("train": a step of its own;
    "evaluate", "predict": a forward of `rows` rows out of training mode, then the Trainer's
    hook), its run ended after."""
    import torch
    from transformers.trainer_callback import TrainerState

    from anatomy.engine import attach
    from anatomy.engine.callbacks import AnatomyCallback

    handler, arguments, control = _trainer(tmp_path, [AnatomyCallback()])
    state = TrainerState()  # evaluate()'s: the Trainer's own since it was built
    for call in calls:
        if call == "train":
            _train(handler, arguments, control, first_step=0, steps=1)
            continue
        handler.model.eval()
        handler.model(torch.randn(rows, 8))
        getattr(handler, f"on_{call}")(arguments, state, control, metrics={})
    attach.current().end()


def _train(handler, arguments, control, first_step: int, steps: int) -> None:
    """train(): a fresh TrainerState (a resume's starts at its checkpoint's step), each step's
    forward, backward and optimizer step between the hooks the Trainer calls."""
    import torch
    from transformers.trainer_callback import TrainerState

    state = TrainerState(global_step=first_step, max_steps=first_step + steps)
    handler.on_train_begin(arguments, state, control)
    for _ in range(steps):
        handler.model(torch.randn(4, 8)).sum().backward()
        handler.on_pre_optimizer_step(arguments, state, control)
        handler.optimizer.step()
        handler.on_optimizer_step(arguments, state, control)
        handler.optimizer.zero_grad()
        state.global_step += 1
        handler.on_step_end(arguments, state, control)
        handler.on_log(arguments, state, control, logs={"loss": 0.5})
    handler.on_train_end(arguments, state, control)


def test_a_callback_added_twice_records_each_phase_and_step_once(heard, tmp_path):
    """`callbacks=[AnatomyCallback(), AnatomyCallback()]` (transformers only warns) recorded the
    weights and training phases twice each and every step twice: "steps: 12" for 6."""
    from anatomy.engine.callbacks import AnatomyCallback

    handler, arguments, control = _trainer(tmp_path, [AnatomyCallback(), AnatomyCallback()])
    _train(handler, arguments, control, first_step=0, steps=3)
    marks = [(m.mark.edge, m.mark.name) for m in heard.of(protocol.Phase)]
    assert marks == [("start", "weights"), ("end", "weights"), ("start", "training"),
                     ("end", "training")]
    assert [m.step.step for m in heard.of(protocol.StepReport)] == [1, 2, 3]
    assert len(heard.of(protocol.ComponentsMeasured)) == 1
    assert len(heard.of(protocol.Summarised)) == 1


@pytest.mark.parametrize("first_step", [0, 6])
def test_a_resumed_training_measures_every_component(heard, tmp_path, first_step):
    """`trainer.train(resume_from_checkpoint=…)` starts at its checkpoint's step (6): the probe
    read only steps below 3, so the resumed run's components had weights and activations but
    no gradients and no optimizer states, as if it trained none."""
    from anatomy.engine.callbacks import AnatomyCallback

    handler, arguments, control = _trainer(tmp_path, [AnatomyCallback()])
    _train(handler, arguments, control, first_step=first_step, steps=4)
    [measured] = heard.of(protocol.ComponentsMeasured)
    parameters = sum(p.numel() for p in handler.model.parameters())
    components = measured.components
    assert components.weights == components.gradients == 4 * parameters
    assert components.optimizer_states == 8 * parameters  # AdamW: two fp32 moments
    assert components.activations > 0
    assert [m.step.step for m in heard.of(protocol.StepReport)] == \
        list(range(first_step + 1, first_step + 5))


def test_a_training_after_the_scripts_run_ended_is_said_once(heard, tmp_path, capsys):
    """`run = anatomy.start()`, the callback made (it joins that run), `run.end()`, then
    `trainer.train()`: the whole training went unrecorded without a word."""
    from anatomy.engine import attach
    from anatomy.engine.callbacks import AnatomyCallback

    callback = AnatomyCallback()
    attach.current().end()
    sent = len(heard.messages)
    handler, arguments, control = _trainer(tmp_path, [callback])
    _train(handler, arguments, control, first_step=0, steps=2)
    assert len(heard.messages) == sent
    # anatomy's own lines: transformers warns, over three lines, of a handler without its
    # DefaultFlowCallback (this test's) in the first test of a process to make one
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("anatomy")]
    assert len(said) == 1 and "run None has ended: a Trainer's training (AnatomyCallback) after" \
        " its end is not recorded" in said[0], said


def test_an_evaluation_between_steps_is_not_the_training_sequence_length():
    """`eval_strategy="steps"` over longer sequences (128 tokens, training at 16): the step after
    the evaluation was recorded at 128 and so was the run's seq_len, which its prediction used."""
    import torch

    from anatomy.engine.callbacks import BatchLengths

    class Tokens(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids.float().sum()

    model = Tokens()
    lengths = BatchLengths(model)
    model(input_ids=torch.zeros(2, 16))
    assert lengths.take() == 16
    model.eval()
    model(input_ids=torch.zeros(2, 128))  # the Trainer's evaluation loop
    model.train()
    model(input_ids=torch.zeros(2, 16))
    assert (lengths.take(), lengths.longest) == (16, 16)


def _accumulated(heard, tmp_path, micro_batches: tuple[tuple[int, ...], ...]):
    """A Trainer's steps of gradient accumulation (`micro_batches`: each step's micro-batches, by
    their samples; the full one is 4) through the callback; the components it measured."""
    import torch
    from transformers.trainer_callback import TrainerState

    from anatomy.engine.callbacks import AnatomyCallback

    handler, arguments, control = _trainer(tmp_path, [AnatomyCallback()])
    state = TrainerState(global_step=0, max_steps=len(micro_batches))
    handler.on_train_begin(arguments, state, control)
    for step in micro_batches:
        for samples in step:
            handler.model(torch.randn(samples, 8)).sum().backward()
        handler.on_pre_optimizer_step(arguments, state, control)
        handler.optimizer.step()
        handler.on_optimizer_step(arguments, state, control)
        handler.optimizer.zero_grad()
        state.global_step += 1
        handler.on_step_end(arguments, state, control)
    handler.on_train_end(arguments, state, control)
    [measured] = heard.of(protocol.ComponentsMeasured)
    return measured.components


def test_an_epochs_partial_last_micro_batch_is_not_the_step_measured(heard, tmp_path):
    """Batch 3 over 8 samples with two micro-batches a step (3 + 3, then 2 at the epoch's end):
    the activations were the 2-sample micro-batch's, the last forward pass, while the prediction
    gives a full one's."""
    from anatomy.analysis.components import partial_micro_batch

    full = _accumulated(heard, tmp_path, ((4, 4), (4, 4)))
    heard.messages.clear()
    ending_short = _accumulated(heard, tmp_path, ((4, 4), (2,)))
    assert ending_short.activations == full.activations > 0
    assert ending_short.micro_batch == full.micro_batch == 4
    assert partial_micro_batch(ending_short, 4) is None


def test_a_training_that_never_had_a_full_micro_batch_says_which_it_had(heard, tmp_path):
    from anatomy.analysis.components import partial_micro_batch

    measured = _accumulated(heard, tmp_path, ((2, 1),))
    assert measured.micro_batch == 2  # the largest it had
    assert partial_micro_batch(measured, 4) == 2


def _tensorboard_trainer(tmp_path, monkeypatch, figures, callbacks=None):
    """A real Trainer with report_to=["tensorboard"] over a model whose every training forward
    makes the run's figures see a sample of (its number) MiB, as the sampler would: step N's
    peak is N MiB, logged at every step."""
    import torch
    from transformers import Trainer, TrainingArguments

    from anatomy.engine import attach
    from anatomy.store import Sample
    from anatomy.units import MIB

    monkeypatch.setattr(attach.Run, "figures", lambda run: figures)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.forwards = torch.nn.Linear(8, 2), 0

        def forward(self, x, labels):
            self.forwards += 1
            figures.see(protocol.Samples([Sample(float(self.forwards), 0, self.forwards * MIB,
                                                 None, None, None)]))
            return {"loss": torch.nn.functional.cross_entropy(self.linear(x), labels)}

    data = [{"x": torch.randn(8), "labels": torch.tensor(i % 2)} for i in range(12)]
    arguments = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=3,
                                  per_device_train_batch_size=4, logging_steps=1,
                                  report_to=["tensorboard"], save_strategy="no",
                                  disable_tqdm=True)
    return Trainer(model=Model(), args=arguments, train_dataset=data, callbacks=callbacks)


def _scalars(tmp_path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return {}
    return {event.step: event.value for event in events.Scalars(tag)}


def test_attached_a_steps_figures_reach_report_tos_tracker_in_that_steps_log(heard, tmp_path,
                                                                              monkeypatch):
    """The Trainer calls report_to's integrations before the callbacks it was given, and each
    logs `logs` as on_log hands it them: `AnatomyCallback.attach(trainer)` puts the callback
    ahead of them, so TensorBoard writes step N's peak at step N (a step late, it would write
    N - 1 there; behind them, nothing)."""
    from anatomy.engine.callbacks import AnatomyCallback
    from anatomy.engine.figures import Figures
    from anatomy.vocabulary import Backend

    figures = Figures([0], Backend.CPU_RSS, t0=0.0)  # what the collector feeds in a real run
    trainer = _tensorboard_trainer(tmp_path, monkeypatch, figures)
    callback = AnatomyCallback.attach(trainer)
    assert trainer.callback_handler.callbacks[0] is callback
    trainer.train()
    assert _scalars(tmp_path, "train/anatomy/peak_mib/cpu") == {1: 1.0, 2: 2.0, 3: 3.0}
    assert _scalars(tmp_path, "train/loss").keys() == {1, 2, 3}  # beside the Trainer's own


def test_a_callback_given_in_callbacks_is_attached_rather_than_made_again(heard, tmp_path,
                                                                          monkeypatch):
    from anatomy.engine.callbacks import AnatomyCallback
    from anatomy.engine.figures import Figures
    from anatomy.vocabulary import Backend

    figures = Figures([0], Backend.CPU_RSS, t0=0.0)
    given = AnatomyCallback()
    trainer = _tensorboard_trainer(tmp_path, monkeypatch, figures, callbacks=[given])
    assert AnatomyCallback.attach(trainer) is given
    assert [type(c) for c in trainer.callback_handler.callbacks].count(AnatomyCallback) == 1
    trainer.train()
    assert _scalars(tmp_path, "train/anatomy/peak_mib/cpu") == {1: 1.0, 2: 2.0, 3: 3.0}
    weights = [m for m in heard.of(protocol.Phase) if m.mark.name == "weights"]
    assert len(weights) == 2  # marked once, at the Trainer's on_init_end: begun and ended


def test_given_only_in_callbacks_with_report_to_it_says_once_how_to_reach_the_trackers(
        heard, tmp_path, monkeypatch, capsys):
    """Behind report_to's integrations the figures reach none of them: said, not hidden."""
    from anatomy.engine.callbacks import AnatomyCallback
    from anatomy.engine.figures import Figures
    from anatomy.vocabulary import Backend

    figures = Figures([0], Backend.CPU_RSS, t0=0.0)
    trainer = _tensorboard_trainer(tmp_path, monkeypatch, figures, callbacks=[AnatomyCallback()])
    trainer.train()
    said = [line for line in capsys.readouterr().err.splitlines() if "AnatomyCallback" in line]
    assert said == ["anatomy: report_to's tensorboard come before the Trainer's callbacks and "
                    "log without anatomy's figures: `anatomy.AnatomyCallback.attach(trainer)` (in"
                    " place of callbacks=[AnatomyCallback()]) puts them in their logs"]


def _loss(outputs, labels, num_items_in_batch=None):
    """A user's loss over the logits (a compute_loss_func)."""
    import torch

    return torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("given, words", [
    ("subclass", ["its own compute_loss, _Weighted.compute_loss"]),
    ("subclass attached", ["its own compute_loss, _Weighted.compute_loss"]),
    ("compute_loss_func", ["compute_loss_func=_loss"]),
    ("seq2seq", None),
    ("plain attached", None),
    ("optimizers", ["its own optimizer, SGD(momentum=0.9)"]),
    ("optimizers attached", ["its own optimizer, SGD(momentum=0.9)"])])
def test_a_trainers_own_loss_is_said_not_predicted_as_transformers_own(heard, tmp_path, given,
                                                                      words):
    """A user's Trainer subclass with a compute_loss of its own (the loss on fp32 logits plus
    a penalty) held 7.3 MB of activations where the prediction, transformers' own loss,
    said 10.4 MB, without a word. The callback finds the Trainer it is called from (given in
    `callbacks=[…]`, or attached) and records a step of the user's own as what the prediction
    does not predict; transformers' own trainers (Seq2SeqTrainer) record nothing of it. So is
    an optimizer of the script's own that the Trainer's optim does not build (`optimizers=`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer

    import anatomy

    class _Weighted(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    kind = {"subclass": _Weighted, "subclass attached": _Weighted, "seq2seq": Seq2SeqTrainer}
    attached = given.endswith("attached")
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = kind.get(given, Trainer)(
        model=model, args=arguments,
        callbacks=[] if attached else [anatomy.AnatomyCallback()],
        compute_loss_func=_loss if given == "compute_loss_func" else None,
        optimizers=(optimizer if given.startswith("optimizers") else None, None))
    if attached:
        anatomy.AnatomyCallback.attach(trainer)
    said = [m.facts for m in heard.of(protocol.Environment) if m.facts.parameters is not None]
    assert len(said) == 1
    assert said[0].left_out == (tuple(words) if words else None)


@pytest.mark.parametrize("when", ["before the Trainer", "after the Trainer", "under LoRA",
                                  "never"])
def test_checkpointing_the_script_turned_on_itself_is_the_runs(heard, tmp_path, when):
    """A script that turned checkpointing on itself (`model.gradient_checkpointing_enable()`,
    as QLoRA's recipes do before peft wraps the model), not through the Trainer's argument, was
    predicted without it: 10.4 MB of activations for a 2-layer Llama that held 4.1 MB. The run
    is described with the model's own checkpointing, turned on before the Trainer was built or
    after, before it trains."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    import anatomy

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    model = LlamaForCausalLM(config)
    # the model's own method: activation_checkpointing_enable since transformers 5.23, whose
    # gradient_checkpointing_enable is its deprecated alias
    turn_on = getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)
    if when in ("before the Trainer", "under LoRA"):
        turn_on()
    if when == "under LoRA":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = Trainer(model=model, args=arguments, callbacks=[anatomy.AnatomyCallback()])
    if when == "after the Trainer":
        turn_on()
    trainer.callback_handler.on_train_begin(arguments, trainer.state, trainer.control)
    described = heard.of(protocol.Described)[-1].options
    assert described["gradient_checkpointing"] is (when != "never")


@pytest.mark.parametrize("when", ["before the Trainer", "after the Trainer", "never"])
def test_parameters_the_script_froze_itself_are_the_runs(heard, tmp_path, when):
    """Parameters the script froze (`requires_grad_(False)` on its embeddings) were predicted
    trained: 3.2 MB of gradients for 2.2 MB held on a 2-layer Llama. The run is described with
    them frozen, by name, and its trained parameters counted, frozen before the Trainer was
    built or after, before it trains."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    import anatomy

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    model = LlamaForCausalLM(config)
    if when == "before the Trainer":
        model.model.embed_tokens.requires_grad_(False)
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = Trainer(model=model, args=arguments, callbacks=[anatomy.AnatomyCallback()])
    if when == "after the Trainer":
        model.model.embed_tokens.requires_grad_(False)
    trainer.callback_handler.on_train_begin(arguments, trainer.state, trainer.control)
    described = heard.of(protocol.Described)[-1].options
    assert described.get("frozen") == (None if when == "never" else "model.embed_tokens")
    trained = [m.facts.trainable_parameters for m in heard.of(protocol.Environment)
               if m.facts.trainable_parameters is not None][-1]
    assert trained == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("calls, words", [
    ([], "the Trainer was built and never trained (no trainer.train())"),
    (["evaluate"], "the Trainer evaluated (trainer.evaluate()) and never trained (no "
     "trainer.train()); the memory after its weights phase is the evaluation's"),
    (["predict", "evaluate", "predict"], "the Trainer predicted (trainer.predict()) and evaluated "
     "(trainer.evaluate()) and never trained (no trainer.train()); the memory after its weights "
     "phase is the prediction and evaluation's"),
    (["train", "evaluate"], None),  # its training phase is there: nothing to say
])
def test_a_run_whose_trainer_never_trained_says_why_it_has_no_training_phase(heard, tmp_path,
                                                                              calls, words):
    """A Trainer that only evaluates (or predicts, or is built and left) left a `completed` run
    with a weights phase alone, without a word. Its run says why as it ends, once, on the run
    (`show` prints its messages) and on the terminal."""
    from anatomy.vocabulary import Level

    _does(tmp_path, calls, rows=4)
    said = [(m.message.level, m.message.text) for m in heard.of(protocol.Note)]
    assert said == ([] if words is None else [(Level.WARNING, f"no training phase: {words}")])


def _stored_options(heard) -> dict:
    """The run's options as the collector stores them: each description over the ones before."""
    stored: dict = {}
    for message in heard.of(protocol.Described):
        stored = options_over(stored, message)
    return stored


# What a Trainer's arguments say of its training alone, which an evaluation never runs
TRAINING_ONLY = {"grad_accum", "gradient_checkpointing", "optim", "seed", "max_steps", "epochs"}


def test_a_trainer_killed_before_it_trains_or_evaluates_keeps_the_arguments_it_was_given(
        heard, tmp_path):
    """The run's options are told as the Trainer is built: a script killed (SIGKILL, the
    kernel's out-of-memory killer) between its Trainer's init and its training keeps them."""
    from anatomy.engine.callbacks import AnatomyCallback

    _trainer(tmp_path, [AnatomyCallback()])
    stored = _stored_options(heard)  # nothing more is said: the process is gone
    assert stored["batch_size"] == 4 and TRAINING_ONLY <= set(stored)


def test_arguments_set_between_the_trainers_init_and_its_training_are_the_runs(heard, tmp_path):
    """`trainer.args.max_steps = 12` after the Trainer was built (a resume's new count, a batch
    size changed in a notebook): `show` said the arguments of the init, max_steps 6."""
    from anatomy.engine import attach
    from anatomy.engine.callbacks import AnatomyCallback

    handler, arguments, control = _trainer(tmp_path, [AnatomyCallback()])
    arguments.max_steps, arguments.per_device_train_batch_size = 12, 2
    _train(handler, arguments, control, first_step=0, steps=1)
    attach.current().end()
    stored = _stored_options(heard)
    assert (stored["max_steps"], stored["batch_size"]) == (12, 2), stored


@pytest.mark.parametrize("calls, batch_size, trained", [
    (["evaluate"], 8, False),
    (["predict", "evaluate"], 8, False),
    (["evaluate", "train"], 4, True),
    (["train", "evaluate"], 4, True),
    ([], 4, True),  # built and left: the arguments it was given, as before
])
def test_a_trainer_that_only_evaluates_stores_its_evaluations_options(heard, tmp_path, calls,
                                                                       batch_size, trained):
    """A Trainer that only evaluates (per_device_eval_batch_size 8) stored its training's
    options (batch 4, its accumulation, optimizer and steps): `runs` and `show` said batch 4 of
    memory measured at 8. Its run's options are the evaluation's, with none of the training's
    alone; a Trainer that trains, before or after it evaluates, keeps its training's."""
    _does(tmp_path, calls, rows=8)
    stored = _stored_options(heard)
    assert stored["batch_size"] == batch_size and stored["precision"] == "fp32"
    assert (TRAINING_ONLY & set(stored)) == (TRAINING_ONLY if trained else set())
    [*_, environment] = [m.facts.training_arguments for m in heard.of(protocol.Environment)
                         if m.facts.training_arguments is not None]
    assert environment.to_dict() == {k: v for k, v in stored.items() if k != "seq_len"}
