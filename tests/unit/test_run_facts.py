"""A run's facts as typed records: what the store's JSON columns hold comes back key for key, a
value of the wrong type is refused where it is built strictly (an import) and kept out of every
reader's way where the store reads its own rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anatomy.analysis.report import report, run_rows
from anatomy.cli import main
from anatomy.store import RunFacts, TrainingArguments, TrainingSummary
from anatomy.store.checks import InvalidValue
from anatomy.views import compare
from anatomy.vocabulary import Phase, Precision, Status
from tests.conftest import seed_run

DATA = Path(__file__).resolve().parent.parent.parent / "docs" / "data"
SHOWN = sorted(p for p in DATA.glob("h200-*.json") if "sweep" not in p.name)


@pytest.mark.parametrize("path", SHOWN, ids=lambda p: p.name)
def test_stored_facts_come_back_key_for_key_in_their_order(path):
    shown = json.loads(path.read_text())
    environment = RunFacts.from_dict(shown["environment"], "environment")
    assert json.dumps(environment.to_dict()) == json.dumps(shown["environment"])
    assert environment.gpu_name == "NVIDIA H200" and environment.parameters > 0
    trainer = {k: v for k, v in shown["summary"].items()
               if k not in ("peak_mb", "peak_bytes", "memory_mb")}
    assert json.dumps(TrainingSummary.from_dict(trainer).to_dict()) == json.dumps(trainer)


def test_a_key_this_anatomy_does_not_know_is_kept_and_a_stored_null_stays():
    stored = {"driver": "580.159.04", "cuda_driver": None, "newer_fact": {"a": [1, 2]}}
    facts = RunFacts.from_dict(stored)
    assert facts.to_dict() == stored and list(facts.to_dict()) == list(stored)
    assert facts.driver == "580.159.04" and facts.cuda_driver is None


def test_facts_reported_later_merge_as_a_dict_update_would():
    first = RunFacts.from_dict({"driver": "1", "gpu_name": None, "ram_total": 8})
    later = RunFacts(torch="2.13.0", driver="2", world_size=2, strategy="fsdp")
    merged = first.merged(later)
    assert merged.to_dict() == {"driver": "2", "gpu_name": None, "ram_total": 8,
                                "world_size": 2, "strategy": "fsdp", "torch": "2.13.0"}
    assert merged.strategy == "fsdp" and merged.device == "CPU"


def test_a_writer_nests_records_as_it_builds_them_and_they_store_as_json():
    """The Trainer callback's facts: its training arguments, a record of their own."""
    arguments = TrainingArguments.of(batch_size=4, precision=Precision.BF16, max_steps=None)
    facts = RunFacts.of(training_arguments=arguments, world_size=2)
    assert facts.training_arguments is arguments
    assert facts.to_dict() == {"training_arguments": {"batch_size": 4, "precision": "bf16",
                                                      "max_steps": None}, "world_size": 2}
    with pytest.raises(TypeError, match="no field 'batch'"):
        TrainingArguments.of(batch=4)


@pytest.mark.parametrize("value", ["two", [2], {"a": 1}, 0, True, 2.0])
def test_a_world_size_that_is_no_whole_number_from_1_is_refused_with_its_place(value):
    with pytest.raises(InvalidValue) as refused:
        RunFacts.from_dict({"world_size": value}, "runs[0].run.environment")
    assert str(refused.value).startswith("runs[0].run.environment.world_size: must be a whole "
                                         "number from 1 to 65536, got ")


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_a_training_whose_loss_diverged_is_summarised_without_its_loss(store, loss, capsys):
    """A user's Trainer with AnatomyCallback and logging_nan_inf_filter=False, whose loss went
    NaN: on_train_end raised InvalidValue ("TrainingSummary.loss: must be a finite number, got
    nan") in the user's script, and the run was stored as failed."""
    summary = TrainingSummary.of(time_s=0.6, samples_per_second=26.0, steps=4, loss=loss)
    assert summary.loss is None and summary.steps == 4
    run_id = seed_run(store)
    store.update_run(run_id, summary=summary)
    assert main(["export", str(run_id), "--format", "json", "--output",
                 str(store.path.with_name("run.json")), "--store", str(store.path)]) == 0
    assert main(["import", str(store.path.with_name("run.json")), "--copy",
                 "--store", str(store.path)]) == 0


def test_a_wrong_value_an_older_import_stored_is_kept_out_of_every_readers_way(store, capsys):
    """A store written before imports built these types may hold one: it lists, shows and
    exports as before, the value read as unknown (one process) and printed as stored."""
    run_id = seed_run(store)
    with store.connect() as db:
        db.execute("UPDATE runs SET environment = ? WHERE id = ?",
                   (json.dumps({"gpu_name": "NVIDIA H200", "world_size": "two"}), run_id))
    run = store.run(run_id)
    assert run.environment.world_size is None and run.environment.gpu_name == "NVIDIA H200"
    rep = report(store, run_id)
    assert rep.world_size == 1 and rep.to_dict()["environment"]["world_size"] == "two"
    assert [row.device for row in run_rows(store)] == ["NVIDIA H200"]
    for command in (["runs"], ["show", str(run_id)], ["export", str(run_id), "--format", "json"]):
        assert main([*command, "--store", str(store.path)]) == 0, command
    assert "Traceback" not in capsys.readouterr().err


def test_a_name_is_its_stored_string():
    assert Status.COMPLETED == "completed" and f"{Phase.TRAINING}" == "training"
    assert json.dumps({Phase.KERNEL: Status.OOM}) == '{"kernel": "oom"}'
    assert Status("stopped") is Status.STOPPED


def test_a_marks_edge_a_notes_level_and_a_models_source_are_names_stored_as_their_text(store):
    """They were strings compared by their spelling ("start", "warning", "preset"): each is now
    a vocabulary name, and the store and show --json keep the text they always had."""
    import queue
    import time

    from anatomy.analysis import models
    from anatomy.engine.reporter import Reporter
    from anatomy.vocabulary import Edge, Level, ModelSource

    sent: queue.Queue = queue.Queue()
    reporter = Reporter(sent, time.monotonic())
    reporter.begin(Phase.TRAINING)
    reporter.end(Phase.TRAINING)
    reporter.tell(Level.WARNING, "eval_strategy 'no'")
    marks = [sent.get().mark for _ in range(2)]
    note = sent.get().message
    assert [mark.edge for mark in marks] == [Edge.START, Edge.END]
    assert all(type(mark.edge) is Edge for mark in marks) and type(note.level) is Level
    assert models.resolve("tiny").source is ModelSource.PRESET
    run_id = store.create_run({"model": "tiny"}, "cpu-rss", "rss", 0,
                              {"model_source": models.resolve("tiny").source})
    store.write(run_id, phases=marks, messages=[note])
    shown = report(store, run_id).to_dict()
    assert json.dumps(shown["environment"]["model_source"]) == '"preset"'
    assert [(m.level, type(m.level)) for m in store.messages(run_id)] == [("warning", str)]
    assert [(p.name, p.end_s is not None) for p in store.phases(run_id)] == [("training", True)]


def test_an_image_models_heading_names_its_images_not_a_sequence_length(store, tmp_path):
    """A ResNet's run was headed "batch size 8, seq len 128": the option its images never read.
    The worker records the images' side (224 where the config names none); the heading and the
    HTML export say it instead."""
    text_run, image_run = seed_run(store), seed_run(store)
    store.merge_environment(image_run, {"task": "image classification", "image_size": 224})
    assert "seq len 512" in report(store, text_run).title()
    title = report(store, image_run).title()
    assert "224×224 images" in title and "seq len" not in title, title
    labels = compare.run_labels([report(store, text_run), report(store, image_run)])
    # A sequence length applies to one of the two: no difference, said in neither label.
    assert "seq" not in labels[text_run] and "seq" not in labels[image_run], labels
    page = tmp_path / "runs.html"
    assert main(["export", str(image_run), "--format", "html", "--output", str(page),
                 "--store", str(store.path)]) == 0
    chart = page.read_text()  # the heading inside plotly's JSON: "×" written as its escape
    assert "224\\u00d7224 images" in chart and "seq len" not in chart


def test_under_watch_the_callback_records_the_processes_launched_where_the_trainer_counts_fewer(monkeypatch):
    """torchrun on CPU ranks leaves each rank's Trainer undistributed (its world size 1): under
    `anatomy watch` (or as a host's part of a run across hosts) the launch's ranks are recorded,
    and the run is one of 2 processes (before: the callback's world size 1 overwrote the
    watch's 2, and show hid rank 1); otherwise rank 0 records its own processes alone, a run of
    the Trainer's one."""
    from types import SimpleNamespace

    from anatomy.engine.callbacks import _training_facts

    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1,
                           bf16=False, fp16=False, gradient_checkpointing=False,
                           optim="adamw_torch", seed=42, max_steps=4, num_train_epochs=1.0,
                           world_size=1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _training_facts(args, None).world_size == 1  # rank 0 alone records
    assert _training_facts(args, None, of_a_launch=True).world_size == 2
    monkeypatch.setenv("WORLD_SIZE", "two")  # unreadable: the Trainer's own figure
    assert _training_facts(args, None, of_a_launch=True).world_size == 1
    monkeypatch.delenv("WORLD_SIZE")
    args.world_size = 4  # a distributed Trainer's own count stands
    assert _training_facts(args, None).world_size == 4


def test_a_watched_command_is_shown_quoted_as_a_shell_reads_it():
    """`show`'s "started by" ran a command's arguments together: `anatomy watch -- python
    'my run.py' 'a b'` read as four words, which the user could not paste to run it again."""
    from anatomy.store.facts import RunSource
    from anatomy.vocabulary import SourceKind

    source = RunSource.of(kind=SourceKind.WATCH, command=("/usr/bin/python3", "my run.py",
                                                          "--name", "a b", "ü"))
    assert source.words() == "anatomy watch -- /usr/bin/python3 'my run.py' --name 'a b' 'ü'"
    assert source.short_words() == "anatomy watch -- python3 'my run.py' --name 'a b' 'ü'"
