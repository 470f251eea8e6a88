"""Validation of every run option: a message that names the field and its range; nothing starts."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from anatomy.analysis.options import FIELDS, InvalidOptions, RunOptions, defaults_for, validate
from anatomy.store import checks
from anatomy.views import text


def test_defaults_fit_the_machine():
    assert defaults_for(has_gpu=True).model == "bert-large-uncased"
    assert defaults_for(has_gpu=False).model == "tiny"
    assert defaults_for(True).batch_size == 4 and defaults_for(True).seq_len == 512
    assert validate(defaults_for(False), gpu_count=0) == {}
    assert validate(defaults_for(True), gpu_count=1) == {}


RANGED = [name for name, f in FIELDS.items() if f.low is not None]


@pytest.mark.parametrize("name", RANGED)
def test_each_number_below_and_above_its_range_is_refused(name):
    field = FIELDS[name]
    for value in (field.low - 1, field.high + 1):
        errors = validate(dataclasses.replace(RunOptions(), **{name: value}), gpu_count=64)
        assert name in errors
        assert errors[name].startswith(f"{name}:")
        assert str(field.low) in errors[name] and str(field.high) in errors[name]


@pytest.mark.parametrize("name", RANGED)
def test_each_number_refuses_a_wrong_type(name):
    errors = validate(dataclasses.replace(RunOptions(), **{name: "4"}), gpu_count=64)
    assert "whole number" in errors[name]


@pytest.mark.parametrize("name", [n for n, f in FIELDS.items() if f.choices])
def test_each_choice_refuses_an_unknown_value(name):
    errors = validate(dataclasses.replace(RunOptions(), **{name: "nonsense"}), gpu_count=1)
    assert "nonsense" in errors[name]
    assert all(choice in errors[name] for choice in FIELDS[name].choices)


def test_flag_refuses_a_non_boolean():
    errors = validate(RunOptions(gradient_checkpointing="yes"), gpu_count=0)
    assert "gradient_checkpointing" in errors


def test_max_steps_may_be_unset_but_not_zero():
    assert "max_steps" not in validate(RunOptions(max_steps=None), 0)
    assert "max_steps" in validate(RunOptions(max_steps=0), 0)


def test_runs_stored_with_a_preset_read_as_their_model():
    assert RunOptions(preset="gpt2").model == "gpt2" == RunOptions(model="gpt2").preset
    assert RunOptions.from_dict({"preset": "bert-base-uncased"}).model == "bert-base-uncased"
    assert "preset" not in RunOptions().to_dict() and RunOptions().to_dict()["model"] == "tiny"


def test_sequence_longer_than_the_preset_positions():
    errors = validate(RunOptions(model="tiny", seq_len=513), gpu_count=0)
    assert "512" in errors["seq_len"]


def test_gpu_index_and_precision_follow_the_machine():
    assert "no GPU" in validate(RunOptions(gpu=1), gpu_count=0)["gpu"]
    assert "0 to 1" in validate(RunOptions(gpu=2), gpu_count=2)["gpu"]
    assert "fp16 needs a GPU" in validate(RunOptions(precision="fp16"), gpu_count=0)["precision"]
    assert validate(RunOptions(precision="bf16"), gpu_count=0) == {}


def test_several_wrong_fields_are_all_reported():
    errors = validate(RunOptions(batch_size=0, optim="lion", seed=-1), gpu_count=0)
    assert set(errors) == {"batch_size", "optim", "seed"}


def test_invalid_options_start_nothing(manager, store):
    with pytest.raises(InvalidOptions) as raised:
        manager.start(RunOptions(batch_size=0))
    assert "batch_size" in raised.value.errors
    assert store.runs() == []
    assert manager.active == {}


def test_total_steps_follows_the_trainer_arithmetic():
    assert RunOptions(dataset_size=512, batch_size=4).total_steps() == 128
    assert RunOptions(dataset_size=512, batch_size=4, grad_accum=4, epochs=2).total_steps() == 64
    assert RunOptions(max_steps=7).total_steps() == 7
    # Several processes share the data: each rank runs 64 of the 128 batches (each took 64 steps;
    # the form said 128).
    assert RunOptions(dataset_size=512, batch_size=4, processes=2).total_steps() == 64
    assert RunOptions(dataset_size=512, batch_size=4, gpus="0,1,2").total_steps() == 43


@pytest.mark.parametrize("gpus", [",,", "0,,1", "0,"])
def test_gpus_with_an_empty_entry_are_refused_in_a_line(gpus):
    errors = validate(RunOptions(gpus=gpus), 2)
    assert list(errors) == ["gpus"] and "empty entry" in errors["gpus"]


def test_the_defaults_are_plain_values_as_stored_options_read_back():
    # A Precision or Strategy member as a default would print as <Precision.FP32: 'fp32'>: a
    # script written from the options' repr would not parse, and a run stored before an option
    # existed (its default) would compare as differing from one that stored "ddp".
    options = RunOptions().to_dict()
    assert ast.literal_eval(repr(options)) == options
    assert {type(options["precision"]), type(options["strategy"])} == {str}


@pytest.mark.parametrize("word", ["1", "007", "²", "٣", "-1", "1.0", "9" * 5000, "12345678901234567890"])
def test_a_gpu_index_and_a_run_id_are_the_same_ascii_digits(word):
    # One reading of a typed number (store.checks.digits): the options' GPU indices and the pages'
    # run ids refused "²" alike in two copies of the check, and 5000 nines raised in int().
    refused = "not a GPU index" in validate(RunOptions(gpus=f"{word},0"), 64).get("gpus", "")
    assert refused == (text.run_id(word) is None) == (checks.digits(word) is None)
