"""A user's own runs (a Trainer with the callback, the phase API, a watched command) as every page
and the CLI tell them: only what the run reported, the user's name for it, explanations that fit
the way it was recorded, and a CPU prediction that relates to the measured curve."""

from __future__ import annotations

import re

import pytest

from anatomy.analysis.report import report, run_rows
from anatomy.prediction import Prediction, breakdown
from anatomy.views import anatomy as anatomy_view
from anatomy.views import compare, text
from anatomy.views import live as live_view
from anatomy.views import runs as runs_view
from tests.conftest import USERS_PARAMETERS, small_ner_config


def test_compare_shows_only_the_options_a_users_run_reported(store, seed, seed_users):
    """A plain loop was labelled "model tiny · bs 4 · seq 512 · 1 epochs · adamw_torch ·
    lora_rank 0" and its table showed dataset size 512, fp32 and seed 42: the defaults."""
    ours, loop, trainer = seed(), seed_users("phase api"), seed_users("trainer")
    reports = [report(store, i) for i in (ours, loop, trainer)]
    labels = compare.run_labels(reports)
    assert labels[loop].startswith(f"Run {loop}")
    for word in ("tiny", "bs", "seq", "epoch", "adamw", "lora", "None"):
        assert word not in labels[loop].lower(), labels[loop]
    assert "BertForSequenceClassification" in labels[trainer]  # its model, as the callback said
    table = {row["what"]: row for row in compare.side_by_side(reports)}
    for option in ("Dataset size", "Precision", "Seed", "Model", "Batch size", "LoRA rank"):
        assert table[option][f"Run {loop}"] == "—", option
    assert table["Model"][f"Run {trainer}"] == "BertForSequenceClassification"
    assert table["Batch size"][f"Run {trainer}"] == "8"  # what TrainingArguments said
    assert table["Dataset size"][f"Run {trainer}"] == "—"  # which the callback cannot know


def test_the_users_name_is_the_runs_name_in_headings_pickers_and_lists(store, seed_users):
    named = seed_users("phase api", name="plain loop: tiny GPT-2")
    rep = report(store, named)
    assert rep.title() == f"Run {named}: plain loop: tiny GPT-2 on CPU (script train.py)"
    choice = text.run_choice(store.run(named))
    assert "plain loop: tiny GPT-2" in choice and "None" not in choice
    assert "batch" not in choice  # it reported none
    row = next(r for r in runs_view.table(run_rows(store)) if r["Run"] == named)
    assert row["Name"] == "plain loop: tiny GPT-2" and row["Model"] is None
    assert row["Started by"] == "script train.py"


@pytest.mark.parametrize("shape, steps, components, profile", [
    ("trainer", None, None, "Only anatomy's own runs are profiled"),
    ("phase api", None, "the phase API marks phases and steps", "Only anatomy's own runs"),
    ("command", "A command watched without anatomy's callback or phase API reports no steps",
     "a watched command is measured from outside", "Only anatomy's own runs"),
])
def test_the_explanations_fit_the_way_a_users_run_was_recorded(store, seed_users, shape, steps,
                                                                 components, profile):
    """"No training step recorded yet." for a finished watch run; "recorded before they were
    measured" for a 50-step phase-API run; "The Trainer's loss" under a loop without a Trainer."""
    rep = report(store, seed_users(shape))
    if steps is not None:
        assert text.no_steps(rep).startswith(steps)
    assert "yet" not in text.no_steps(rep)  # it has ended
    if components is not None:
        assert components in anatomy_view.no_components(rep)
    assert "recorded before they were measured" not in anatomy_view.no_components(rep)
    assert anatomy_view.not_profiled(rep).startswith(profile)
    if rep.steps:  # the chart's caption: the Trainer's loss only where a Trainer logged it
        assert ("Trainer" in text.steps_caption(rep, store.steps(rep.id))) == (shape == "trainer")
        # The same on Compare's overlay and under the Anatomy page's first steps; AdamW named
        # only for a run that said it trained with it.
        assert ("Trainer" in compare.steps_caption([rep])) == (shape == "trainer")
        first = anatomy_view.first_steps_caption(rep, None)
        assert ("Trainer" in first, "AdamW" in first) == ((shape == "trainer",) * 2)
    # The Live page's phases: a watched command's own phase, not four dashes it never had.
    metrics = [(m.name, m.memory_mb) for m in live_view.phase_metrics(rep)]
    if shape == "command":
        assert metrics == [("process", 700)]
    else:
        assert [name for name, _ in metrics] == ["baseline", "torch loaded", "weights", "training"]




def test_compares_bars_reach_a_callback_runs_training_end_and_say_what_they_cannot_split(
        store, seed_users):
    """A Trainer run recorded by the callback alone (from its weights phase on) had a bar of its
    training increase alone, from 0 MB (200 MB under a 700 MB peak), and a watched command no bar
    and no word why."""
    from anatomy.analysis.compare import memory_parts
    from anatomy.views.figures import compare as compare_figures
    from anatomy.vocabulary import Unsplit

    trainer, command = report(store, seed_users("trainer")), report(store, seed_users("command"))
    parts = memory_parts(trainer)
    assert parts[0].part == Unsplit.BEFORE_RECORDING and parts[0].bytes == 500 * 2**20  # weights end
    assert sum(p.bytes for p in parts) == 700 * 2**20  # the training's end, where the peak is
    assert memory_parts(command) == []
    notes = compare.bars_notes([trainer, command])
    assert [n.split(" (")[0] for n in notes] == [f"Run {trainer.id}", f"Run {command.id}"]
    assert "before the recording" in notes[0] and "no bar" in notes[1]
    names = [t.name for t in compare_figures.memory_bars_figure([trainer, command]).data]
    assert names[0] == "before the recording"

@pytest.mark.parametrize("shape", ["trainer", "phase api", "command"])
def test_show_prints_no_none_and_only_the_options_a_users_run_reported(store, seed_users, capsys,
                                                                      shape):
    """`anatomy show` printed "None" for what a user's run did not report (the Trainer's
    max_steps=None among its options)."""
    from anatomy import cli

    run_id = seed_users(shape)
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\bNone\b", out), out
    (options,) = [line for line in out.splitlines() if line.startswith("options: ")]
    if shape == "trainer":  # what TrainingArguments said, and nothing it left unset
        assert "batch_size=8" in options and "max_steps" not in options
    else:
        assert options == "options: (not reported)"


def test_show_prints_a_cpu_runs_options_without_a_gpu_or_an_empty_value(store, seed, capsys):
    """`show` of `anatomy run` on a CPU printed "gpu=0, gpus=, … lora_targets=" (the form's
    defaults for a GPU it never had, and values left empty)."""
    from anatomy import cli

    run_id = seed(backend="cpu-rss")
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    (options,) = [line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("options: ")]
    assert "batch_size=4" in options
    assert not re.search(r"\bgpus?=|strategy=|=(,|$)", options), options

def test_a_cpu_runs_bars_and_table_end_on_the_same_peak_and_the_prediction_reaches_it(
        store, seed_users):
    """The CPU prediction ("about 97 MB for tensors, plus the Python process") could not be
    related to the curve (695 MB), nor the Anatomy page's bars (80 MB) to its table (657 MB)."""
    rep = report(store, seed_users("trainer"))
    prediction = breakdown.prediction_for(rep)
    rows = {r.component: r for r in anatomy_view.component_rows(rep, prediction)}
    (peak,) = [name for name in rows if name.startswith("peak (RSS")]
    sides = anatomy_view.waterfall(rep, prediction)
    for side, value in (("measured", rows[peak].measured), ("predicted", rows[peak].predicted)):
        steps = sides[side]
        assert steps[-1].label == peak  # the bars end where the table does
        assert sum(s.bytes for s in steps if s.measure == "relative") == value
    expected = breakdown.cpu_peak(rep, prediction)
    # What the prediction covers (the tensors) on top of what it does not (measured before
    # training, beyond the weights: the interpreter and the libraries), on the RSS's own axis.
    assert rows[peak].predicted == expected.peak
    assert expected.tensors == prediction.peak
    assert expected.before_training == 500 * 2**20 - rep.components.weights  # weights phase end
    assert re.search(r"not predicted", rows[peak].note)


def test_a_users_launch_without_a_model_has_no_rank_prediction(store, seed_users):
    """Two ranks of a plain loop under `watch`: the Anatomy page said "No prediction: … recorded
    no model" and then, per process, "each of the 2 processes (ddp) should need about 157 MB" —
    the default model's prediction."""
    run_id = seed_users("phase api")
    store.merge_environment(run_id, {"world_size": 2})
    rep = report(store, run_id)
    assert rep.world_size == 2 and breakdown.prediction_for(rep) is None
    assert breakdown.rank_prediction_for(rep) is None


def test_a_users_trainer_launch_is_predicted_per_rank_from_the_model_it_recorded(store,
                                                                                 seed_users):
    """A Trainer with the callback in each of two ranks: each rank's prediction is of the config
    the callback recorded (the default preset before)."""
    run_id = seed_users("trainer")
    store.merge_environment(run_id, {"world_size": 2})
    ranks = breakdown.rank_prediction_for(report(store, run_id))
    assert ranks is not None and ranks.world_size == 2
    assert ranks.alone.parameters == USERS_PARAMETERS


@pytest.mark.parametrize("status", ["failed", "running"])
def test_a_script_that_marked_nothing_is_told_as_the_phase_api_not_a_watched_command(
        store, status):
    """anatomy.start() in a script that ended (or has not yet come) before its first phase: the
    Anatomy page said "A watched command that marks no phases…" and "a watched command is
    measured from outside" of it, beside "No prediction: the phase API records no model"."""
    run_id = store.create_run({}, "cpu-rss", "rss", 0, {"gpu_name": None}, preset="train.py",
                              source={"kind": "script", "script": "/home/user/train.py"})
    if status != "running":
        store.finish(run_id, status, "Traceback (most recent call last): …")
    rep = report(store, run_id)
    words = " ".join((anatomy_view.no_components(rep), anatomy_view.no_training(rep),
                      text.no_steps(rep)))
    assert "watched command" not in words and "phase API" in words
    assert ("has not reached the training phase yet" in words) == (status == "running")
    assert ("never reached the training phase" in words) == (status != "running")


def test_a_users_model_that_cannot_be_predicted_is_named_by_its_class(store, seed_users):
    """A Trainer's model of a type this transformers does not know: the Anatomy page said "No
    prediction: model: anatomy-model-1yazdoe_: transformers does not know model_type …", the
    random name of the folder its config was written to."""
    import transformers  # noqa: F401 - the config checked in this process, not in a child's

    run_id = seed_users("trainer")
    environment = store.run(run_id).environment.to_dict()
    store.update_run(run_id, environment={**environment, "model_config": {
        "model_type": "nonsense_arch", "hidden_size": 3}})
    reason = breakdown.predicted(report(store, run_id)).reason
    assert reason == ("model: BertForSequenceClassification: transformers does not know "
                      "model_type 'nonsense_arch'")


def test_a_users_token_classifier_is_predicted_with_its_own_head(store, seed_users):
    """A Trainer fine-tuning an NER model with the callback: the config it recorded names
    BertForTokenClassification, which the Anatomy page refused ("a token classification head:
    anatomy trains …"); it predicts that head, its nine labels, a class for every token."""
    import transformers  # noqa: F401 - the config checked in this process, not in a child's

    run_id = seed_users("trainer")
    environment = store.run(run_id).environment.to_dict()
    store.update_run(run_id, environment={**environment, "model_config": small_ner_config(),
                                          "model_class": "BertForTokenClassification"})
    predicted = breakdown.predicted(report(store, run_id))
    assert isinstance(predicted, Prediction), predicted
    assert predicted.parameters == 166_089  # the shrunk NER BERT, its classifier of 9 labels


def test_the_loss_caption_says_how_often_the_trainer_logged_it(store, seed_users):
    """"logged every step" was said of a Trainer run with logging_steps=5 (6 points of 30)."""
    import sqlite3

    from tests.apptest import open_page

    run_id = seed_users("trainer")  # 8 steps, each with its loss
    app = open_page("screens/runs.py", run=str(run_id))
    app.segmented_control(key="runs_view").set_value("steps").run()
    every = [c.value for c in app.caption if c.value.startswith("The Trainer's loss")]
    assert every == ["The Trainer's loss at each step (logged every step) and the time each step "
                     "took, from the end of the one before; step 1 also holds the Trainer's "
                     "first-step setup."]
    with sqlite3.connect(store.path) as db:  # logging_steps=4: the loss at steps 4 and 8
        db.execute("UPDATE steps SET loss = NULL WHERE run_id = ? AND step % 4 != 0", (run_id,))
    app.run()
    captions = [c.value for c in app.caption if c.value.startswith("The Trainer's loss")]
    assert captions == ["The Trainer's loss every 4 steps, as it logged it (2 of 8 steps) and the "
                        "time each step took, from the end of the one before; step 1 also holds "
                        "the Trainer's first-step setup."]


def test_a_users_padded_batch_is_predicted_as_the_callback_measured_it(store, seed_users,
                                                                       monkeypatch):
    """A Trainer padding each batch to its longest (DataCollatorForLanguageModeling): the
    callback measured a batch of 4 padded to 36 tokens, its texts 36, 28, 27 and 14 long, and the
    Anatomy page predicted 4 × 36 tokens without padding, which makes no attention mask: on a
    24-layer Qwen3 on the CPU, 68.6 MiB of activations against 72.5 measured (−5.3 %); traced
    with the padded batch, 76,021,064 bytes, the measured figure to the byte."""
    from anatomy.analysis.lengths import TextBatch
    from anatomy.prediction import request

    run_id = seed_users("trainer")  # its longest batch: 64 tokens
    summary = store.run(run_id).summary.to_dict()
    traced = []
    monkeypatch.setattr(request, "predict", lambda options, **kw: traced.append(kw["text"]))
    for padded_to, lengths in ((64, [14, 64, 28, 27]), (36, [14, 36, 28, 27])):
        store.update_run(run_id, summary={**summary, "components": {
            **summary["components"], "micro_batch": 4, "padded_to": padded_to,
            "sequence_lengths": lengths}})
        breakdown.predicted(report(store, run_id))
    # A measured batch shorter than the longest: the peak is made at the longest, as before.
    assert traced == [TextBatch((64, 28, 27, 14), 64, ("attention_mask",), "right"), None]
