"""Validation of every run option: a message that names the field and its range; nothing starts.
The limits are RunOptions' declaration, and every front (the CLI's --help, the form, an import)
says the ones it reads there."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json

import pytest
from pydantic import ValidationError

from anatomy.analysis import transfer
from anatomy.analysis.options import (
    FIELDS,
    NAMES,
    Checked,
    InvalidOptions,
    Kind,
    ReportedOptions,
    RunOptions,
    defaults_for,
    validate,
    validated,
)
from anatomy.cli.arguments import add_run_options
from anatomy.store import TrainingArguments, checks
from anatomy.views import text
from anatomy.vocabulary import Precision
from tests.apptest import open_page
from tests.conftest import exported


def test_defaults_fit_the_machine():
    assert defaults_for(has_gpu=True).model == "bert-large-uncased"
    assert defaults_for(has_gpu=False).model == "tiny"
    assert defaults_for(True).batch_size == 4 and defaults_for(True).seq_len == 512
    assert validate(defaults_for(False), gpu_count=0) == {}
    assert validate(defaults_for(True), gpu_count=1) == {}


RANGED = [name for name, f in FIELDS.items() if f.kind == Kind.NUMBER]


def _read(**values) -> dict[str, str]:
    """The messages `values` over the defaults are refused with (empty: read)."""
    try:
        RunOptions.read(values)
    except InvalidOptions as error:
        return error.errors
    return {}


@pytest.mark.parametrize("name", RANGED)
def test_each_number_below_and_above_its_range_is_refused(name):
    field = FIELDS[name]
    for value in (field.low - 1, field.high + 1):
        errors = _read(**{name: value})
        assert errors[name] == f"{name}: {value} is out of range: {field.low} to {field.high}"


@pytest.mark.parametrize("name", RANGED)
def test_each_number_refuses_a_wrong_type(name):
    field = FIELDS[name]
    # a share (a dropout) takes a whole number as the number it is; text and a flag are none
    for wrong in ("4", 4.0, True) if field.whole else ("0.1", True, None):
        assert _read(**{name: wrong})[name] == (
            f"{name}: must be a {'whole ' if field.whole else ''}number from {field.limits()},"
            f" got {checks.shown(wrong)}")
    if not field.whole:
        assert RunOptions.read({name: 0, "lora_rank": 4}) == RunOptions(lora_rank=4)
        assert getattr(RunOptions.read({name: 0.05, "lora_rank": 4}), name) == 0.05


@pytest.mark.parametrize("name", [n for n, f in FIELDS.items() if f.kind == Kind.CHOICE])
def test_each_choice_refuses_an_unknown_value(name):
    errors = _read(**{name: "nonsense"})
    assert errors[name] == f"{name}: 'nonsense' is not one of {', '.join(FIELDS[name].choices)}"


def test_flag_refuses_a_non_boolean():
    assert _read(gradient_checkpointing="yes") == {
        "gradient_checkpointing": "gradient_checkpointing: must be true or false"}


def test_max_steps_may_be_unset_but_not_zero():
    assert RunOptions.read({"max_steps": None}).max_steps is None
    assert "max_steps" in _read(max_steps=0)


def test_runs_stored_with_a_preset_read_as_their_model():
    assert RunOptions(preset="gpt2").model == "gpt2" == RunOptions(model="gpt2").preset
    assert RunOptions.from_dict({"preset": "bert-base-uncased"}).model == "bert-base-uncased"
    assert RunOptions.read({"preset": "gpt2"}).model == "gpt2"
    assert "preset" not in RunOptions().to_dict() and RunOptions().to_dict()["model"] == "tiny"


def test_a_stored_value_this_anatomy_refuses_takes_its_default_and_the_rest_stay():
    stored = {**RunOptions(batch_size=8).to_dict(), "epochs": 3.0, "future": 1}
    assert RunOptions.from_dict(stored) == RunOptions(batch_size=8)


def test_sequence_longer_than_the_preset_positions():
    errors = validate(RunOptions(model="tiny", seq_len=513), gpu_count=0)
    assert "512" in errors["seq_len"]


def test_gpu_index_and_precision_follow_the_machine():
    assert "no GPU" in validate(RunOptions(gpu=1), gpu_count=0)["gpu"]
    assert "0 to 1" in validate(RunOptions(gpu=2), gpu_count=2)["gpu"]
    assert "fp16 needs a GPU" in validate(RunOptions(precision="fp16"), gpu_count=0)["precision"]
    assert validate(RunOptions(precision="bf16"), gpu_count=0) == {}


def test_several_wrong_fields_are_all_reported_with_the_machines_too():
    errors = _read(batch_size=0, optim="lion", seed=-1)
    assert set(errors) == {"batch_size", "optim", "seed"}
    with pytest.raises(InvalidOptions) as raised:
        validated({"batch_size": 0, "model": "no-such-model", "gpu": 1}, gpu_count=0)
    assert set(raised.value.errors) == {"batch_size", "model", "gpu"}


def test_invalid_options_start_nothing(manager, store):
    with pytest.raises(InvalidOptions) as raised:
        manager.start(RunOptions(gpu=3))
    assert raised.value.errors == {"gpu": "gpu: 3 is out of range: this machine has no GPU (use 0)"}
    assert store.runs() == []
    assert manager.active == {}


def test_options_are_values_of_their_declared_types():
    options = RunOptions.read({"gpus": "1,0", "lora_targets": "q_proj, v_proj", "lora_rank": 4,
                               "precision": "bf16"})
    assert options.gpus == (1, 0) and options.lora_targets == ("q_proj", "v_proj")
    assert options.precision is options.precision.BF16
    with pytest.raises(ValidationError):  # in code as from a front: a wrong value builds nothing
        dataclasses.replace(options, batch_size=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 8


def test_a_checked_option_set_is_started_without_being_judged_again(manager, store, monkeypatch):
    checked = validated({"model": "tiny", "gpu": 3}, gpu_count=4)  # judged for 4 GPUs
    assert checked == Checked(RunOptions(gpu=3), 4)
    with pytest.raises(InvalidOptions) as raised:  # this machine has none: judged again
        manager.start(checked)
    assert "no GPU" in raised.value.errors["gpu"]


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
    errors = _read(gpus=gpus)
    assert list(errors) == ["gpus"] and "empty entry" in errors["gpus"]


def test_stored_options_are_plain_values_in_the_shape_runs_always_had():
    # A member would print as <Precision.FP32: 'fp32'>: a script written from the stored
    # options' repr would not parse. GPUs and LoRA targets are stored comma-separated.
    options = RunOptions(gpus="0,1", lora_rank=4, lora_targets=["q_proj", "v_proj"]).to_dict()
    assert ast.literal_eval(repr(options)) == options
    assert {type(options["precision"]), type(options["strategy"]), type(options["optim"])} == {str}
    assert (options["gpus"], options["lora_targets"], options["max_steps"]) == \
        ("0,1", "q_proj,v_proj", None)
    assert list(options) == list(FIELDS)
    assert RunOptions.from_dict(options) == RunOptions.read(options)


@pytest.mark.parametrize("word", ["1", "007", "²", "٣", "-1", "1.0", "9" * 5000, "12345678901234567890"])
def test_a_gpu_index_and_a_run_id_are_the_same_ascii_digits(word):
    # One reading of a typed number (store.checks.digits): the options' GPU indices and the pages'
    # run ids refused "²" alike in two copies of the check, and 5000 nines raised in int().
    refused = "not a GPU index" in _read(gpus=f"{word},0").get("gpus", "")
    assert refused == (text.run_id(word) is None) == (checks.digits(word) is None)


# --- one declaration, every front ---

def _help(predicting: bool = False) -> str:
    parser = argparse.ArgumentParser()
    add_run_options(parser, predicting)
    return " ".join(parser.format_help().split())


def test_the_cli_help_says_each_limit_and_choice_the_declaration_has():
    shown = _help()
    for field in FIELDS.values():
        assert "--" + field.name.replace("_", "-") in shown
        if field.kind == Kind.NUMBER:
            assert f"{field.help} ({field.low} to {field.high};" in shown
        if field.kind == Kind.CHOICE:  # offered by argparse, or listed in the help (many)
            assert "{" + ",".join(field.choices) + "}" in shown or \
                f"{field.help}: {', '.join(field.choices)} (default" in shown


def test_the_form_says_each_limit_the_declaration_has(fake_machine):
    drawn = set()
    for gpus in (0, 2):  # the GPU options with GPUs, CPU processes without
        fake_machine(gpus)
        app = open_page("screens/live.py")
        numbers = {w.key: w for w in app.number_input}
        choices = {w.key: w for w in app.selectbox}
        for field in FIELDS.values():
            key = f"option_{field.name}"
            if key in numbers:
                assert f"({field.low} to {field.high}" in numbers[key].help
                assert numbers[key].label == field.label
            elif key in choices and field.kind == Kind.CHOICE:
                assert list(choices[key].options) == list(field.choices)
            else:
                continue
            drawn.add(field.name)
    # the target length is offered for a sequence-to-sequence model alone (no preset is one)
    assert drawn == {n for n, f in FIELDS.items() if f.kind in (Kind.NUMBER, Kind.CHOICE)} - \
        {"target_len"}


@pytest.mark.parametrize("name", RANGED)
def test_an_import_says_each_limit_the_declaration_has(name, source):
    store, run_ids = source
    field = FIELDS[name]
    data = json.loads(exported(store, run_ids[:1]))
    data["runs"][0]["run"]["options"][name] = field.high + 1
    with pytest.raises(transfer.ImportRefused) as refused:
        transfer.read_export(data)
    assert str(refused.value) == (f"runs[0].run.options: {name}: {field.high + 1} is out of "
                                  f"range: {field.low} to {field.high}")


def test_a_users_reported_options_are_declared_beside_run_options_every_one_optional():
    """What a user's training reports is read by RunOptions' own names (the callback's
    TrainingArguments among them), every field None where it said nothing, each value as it was
    written (epochs 1 stays 1, TrainingArguments' 3.0 stays 3.0), and no limit of anatomy's own."""
    reported = [f.name for f in dataclasses.fields(ReportedOptions)]
    assert set(reported) <= set(NAMES)
    assert {f.name for f in dataclasses.fields(TrainingArguments)} - {"extra", "stored_order"} \
        <= set(reported)
    assert ReportedOptions() == ReportedOptions(**{name: None for name in reported})
    read = ReportedOptions.from_dict({"epochs": 1, "batch_size": 8192, "optim": "adamw_bnb_8bit",
                                      "precision": "bf16", "a newer key": [1]})
    assert (read.epochs, type(read.epochs), read.batch_size, read.optim, read.precision) == \
        (1, int, 8192, "adamw_bnb_8bit", Precision.BF16)
    assert ReportedOptions.from_dict({"epochs": 3.0, "seed": "42"}) == ReportedOptions(epochs=3.0)
    with pytest.raises(checks.InvalidValue, match=r"^options\.seed: must be a whole number"):
        ReportedOptions.read({"seed": "42"}, "options")


def test_bf16_weights_are_refused_under_fp16_mixed_precision():
    assert _read(weights="bf16", precision="fp16") == {
        "weights": "weights: bf16 weights train with precision bf16 or fp32 (fp16 mixed precision "
                   "keeps fp32 weights)"}
    assert _read(weights="bf16", precision="bf16") == {} == _read(weights="bf16")


def test_a_target_length_is_for_a_sequence_to_sequence_model_and_within_its_positions(tmp_path):
    """A summary's or a translation's targets: only an encoder-decoder has them, as long as its
    positions allow; elsewhere the option says so in one line rather than being ignored."""
    from transformers import BartConfig

    from anatomy.views.live import offers_target_length

    refused = validate(RunOptions(model="tiny-llama", target_len=8), gpu_count=0)
    assert refused == {"target_len": "target_len: tiny-llama is no sequence-to-sequence model "
                                     "(causal language modelling): it has no target (leave it 0)"}
    config = BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        vocab_size=100, max_position_embeddings=64)
    config.architectures = ["BartForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    assert validate(RunOptions(model=str(tmp_path), seq_len=64, target_len=16), gpu_count=0) == {}
    # the form offers it where it applies
    assert offers_target_length(str(tmp_path)) and not offers_target_length("tiny-llama")
    too_long = validate(RunOptions(model=str(tmp_path), seq_len=64, target_len=65), gpu_count=0)
    assert too_long == {"target_len": "target_len: 65 is out of range for "
                                      f"{tmp_path.name}: 1 to 64"}



def test_the_form_offers_the_attention_where_the_model_has_a_choice(tmp_path):
    """sdpa or eager is a choice for a model whose attention can be either (the presets, a
    saved Llama); a ResNet has no attention, and the form does not offer one."""
    from transformers import LlamaConfig, ResNetConfig

    from anatomy.views.live import offers_attention

    llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, vocab_size=100)
    llama.architectures = ["LlamaForCausalLM"]
    llama.save_pretrained(tmp_path / "llama")
    resnet = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    resnet.architectures = ["ResNetForImageClassification"]
    resnet.save_pretrained(tmp_path / "resnet")
    assert offers_attention("tiny-llama") and offers_attention(str(tmp_path / "llama"))
    assert not offers_attention(str(tmp_path / "resnet"))


def test_frozen_modules_are_names_of_the_model_that_leave_something_to_train(tmp_path):
    """`frozen` names modules or parameters as named_modules writes them; each that is none of
    the model's, everything frozen, a name that is no name, and frozen with LoRA (which
    freezes all but its adapters) are refused in one line, the likely name offered; a config
    as save_pretrained writes it is read as a preset is; stored comma-separated."""
    from transformers import ViTConfig

    assert validate(RunOptions(model="tiny-llama", frozen=("model.embed_tokens",
                                                           "model.layers.0.mlp.up_proj.weight")),
                    gpu_count=0) == {}
    assert validate(RunOptions(model="tiny-llama", frozen=("embed_tokens",)), gpu_count=0) == {
        "frozen": "frozen: embed_tokens names no module or parameter of the model (did you mean "
                  "model.embed_tokens?)"}
    assert validate(RunOptions(model="tiny-llama", frozen=("encoder",)), gpu_count=0) == {
        "frozen": "frozen: encoder names no module or parameter of the model (its modules: "
                  "lm_head, model)"}
    assert validate(RunOptions(model="tiny-llama", frozen=("model", "lm_head")), gpu_count=0) == {
        "frozen": "frozen: model, lm_head freeze every parameter of the model: nothing would "
                  "train"}
    assert _read(frozen="model.embed_tokens", lora_rank=4) == {
        "frozen": "frozen: LoRA freezes every weight but its adapters already (leave frozen "
                  "empty, or the LoRA rank 0)"}
    assert _read(frozen="model/embed") == {
        "frozen": "frozen: 'model/embed' is not a module name (comma-separated names such as "
                  "model.embed_tokens,model.layers.0)"}
    vit = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, image_size=32, patch_size=8, num_labels=3)
    vit.architectures = ["ViTForImageClassification"]
    vit.save_pretrained(tmp_path)
    assert validate(RunOptions(model=str(tmp_path), frozen=("vit",)), gpu_count=0) == {}
    stored = RunOptions(frozen=("vit.embeddings", "vit.encoder.layer.0")).to_dict()["frozen"]
    assert stored == "vit.embeddings,vit.encoder.layer.0"
    assert RunOptions.from_dict({"frozen": stored}).frozen == ("vit.embeddings",
                                                               "vit.encoder.layer.0")
