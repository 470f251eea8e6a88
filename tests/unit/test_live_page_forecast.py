"""The Live page's additions: the memory and time forecast before a run, what it says while and
after, and a stored run shown by its id."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis import duration, models
from anatomy.analysis.machine import Device, Machine
from anatomy.analysis.options import RunOptions, defaults_for, validate, validated
from anatomy.analysis.report import report, trained_until_stopped
from anatomy.store import PhaseMark
from anatomy.views import live
from anatomy.views.live import batch_size_forecast, memory_forecast
from tests.apptest import APP

H200 = Machine(backend="nvml", memory_api="v2",
               devices=(Device(index=0, nvml_index=0, name="NVIDIA H200", uuid=None,
                               total=140 * 2**30, memory_api="v2"),),
               driver=None, cuda_driver=None, ram_total=2 * 2**40, why_no_gpu=None)


def test_the_walkthrough_run_fits_an_h200():
    forecast = memory_forecast(validated({"model": "bert-large-uncased", "batch_size": 4}, 1),
                               H200)
    assert forecast.line.startswith("this run should need about 7.0 GiB of GPU memory")
    assert forecast.warning is None


CPU = Machine(backend="cpu-rss", memory_api=None, devices=(), driver=None, cuda_driver=None,
              ram_total=24 * 2**30, why_no_gpu="NVML: NVML Shared Library Not Found")


def test_several_cpu_processes_are_forecast_per_process_with_their_share_of_the_steps(store):
    """The form's Predict ignored Processes: the same memory and "128 steps" as one process,
    while each of the two ranks ran 64."""
    one = defaults_for(False)  # tiny, 512 sequences of 128, batch 4: 128 steps
    alone = live.run_forecast(validated(one, 0), CPU, store)
    two = live.run_forecast(validated(replace(one, processes=2), 0), CPU, store)
    assert alone.line.startswith("this run should need about")
    assert two.line.startswith("each of the 2 processes (ddp) should need about")
    assert "together, plus each process itself" in two.line and "NCCL" not in two.line
    assert "128 steps" in alone.duration and "64 steps" in two.duration
    assert "one process there, 2 here" in two.duration  # the reference trained one


def test_wrong_options_get_no_forecast(store):
    app = AppTest.from_file(APP, default_timeout=30).run()
    app.number_input(key="option_batch_size").set_value(0)
    app.button(key="predict").click().run()
    assert [e.value for e in app.error] == ["0 is out of range: 1 to 4096",
                                            "Fix the fields marked above."]
    assert not any(i.value.startswith("This run should need") for i in app.info)
    assert store.runs() == []


def test_the_forms_lora_dropout_and_weights_are_asked_as_declared(store):
    """The form draws the LoRA dropout from the options' declaration, a number by hundredths;
    without a rank it is refused as `predict` refuses it, with one it is predicted; the weights'
    type is a choice, and bf16 weights are another forecast."""
    app = AppTest.from_file(APP, default_timeout=30).run()
    dropout = app.number_input(key="option_lora_dropout")
    assert (dropout.value, dropout.step, dropout.label) == (0.0, 0.01, "LoRA dropout")
    dropout.set_value(0.05)
    app.button(key="predict").click().run()
    assert [e.value for e in app.error] == ["set a LoRA rank too (“LoRA rank”)",
                                            "Fix the fields marked above."]
    app.number_input(key="option_lora_rank").set_value(4)
    app.button(key="predict").click().run()
    assert not app.error and not app.exception
    fp32 = next(i.value for i in app.info if i.value.startswith("This run should need about"))
    weights = app.selectbox(key="option_weights")
    assert (weights.options, weights.value) == (["fp32", "bf16"], "fp32")
    weights.select("bf16")
    app.button(key="predict").click().run()
    assert not app.error and not app.exception
    bf16 = next(i.value for i in app.info if i.value.startswith("This run should need about"))
    assert bf16 != fp32  # half the weights: another forecast
    assert store.runs() == []


def test_predict_memory_on_the_form_starts_nothing(store):
    app = AppTest.from_file(APP, default_timeout=30).run()
    app.button(key="predict").click().run()
    assert not app.exception
    assert any(info.value.startswith("This run should need about") and "MiB of CPU memory"
               in info.value for info in app.info)
    assert store.runs() == []


def test_the_live_page_shows_a_stored_run_by_its_id(store, seed):
    run_id = seed()
    app = AppTest.from_file(APP, default_timeout=30)
    app.query_params["run"] = str(run_id)
    app.run()
    assert not app.exception
    assert app.subheader[0].value.startswith(f"Run {run_id}:")


def _start_while_held(server, holder: str, description: str) -> AppTest:
    """The form's Start clicked while `holder` holds the device's lock, described as it does."""
    lock = server.manager().reserve(defaults_for(server.device().has_gpu), holder)
    lock.describe(description)
    try:
        app = AppTest.from_file(APP, default_timeout=30).run()
        app.button(key="start").click().run()
    finally:
        lock.release()
    return app


def test_start_is_refused_while_a_sweep_holds_the_device(store):
    from anatomy.dashboard import server

    # What a sweep does for its whole length (engine/sweep.py): the device's lock, in its name.
    app = _start_while_held(server, "a sweep", f"sweep 7 (pid {os.getpid()})")
    assert not app.exception
    assert any(e.value.startswith("Not started: ") and f"is busy: sweep 7 (pid {os.getpid()})"
               in e.value for e in app.error), [e.value for e in app.error]
    assert store.runs() == []



def test_a_refusal_to_start_goes_once_the_run_it_was_about_has_ended(store, seed):
    """"Not started: this machine is busy" stayed above the run after it had finished."""
    from anatomy.dashboard import server
    from anatomy.vocabulary import Status

    run_id = seed(status="running")  # the run this tab shows, holding the device
    app = _start_while_held(server, "a run", f"run {run_id} (pid {os.getpid()})")
    assert any(e.value.startswith("Not started: ") and f"busy: run {run_id}" in e.value
               for e in app.error), [e.value for e in app.error]
    store.finish(run_id, Status.COMPLETED)
    app.run()  # the page's next rerun, the run ended
    assert not app.exception
    assert not [e.value for e in app.error if e.value.startswith("Not started")]
    assert len(store.runs()) == 1  # the refused start started nothing

# --- how long a run should take (analysis/duration.py), before it starts ---

def test_without_a_stored_run_the_estimate_comes_from_the_reference_run():
    options = defaults_for(False)  # tiny, batch 4, seq 128, 512 samples: 128 steps
    estimate = duration.estimate_from([], options, "cpu-rss", None)
    reference = duration.REFERENCES[("tiny", "cpu-rss")]
    step = reference.step_s + reference.token_s * 4 * 128
    assert estimate.steps == 128 and estimate.step_s == pytest.approx(step)
    assert estimate.total_s == pytest.approx(reference.setup_s + 128 * step)
    assert "(the tiny model measured on a busy 2-core CPU without a GPU; no run of it is stored " \
        "here yet)" in estimate.line() and "min" in estimate.line()
    assert "VM" not in estimate.line()  # a machine the user never heard of
    longer = duration.estimate_from([], replace(options, seq_len=256), "cpu-rss", None)
    assert step < longer.step_s < 2 * step  # twice the tokens, the same fixed part


def test_a_long_or_one_step_run_is_timed_in_plain_words():
    """Batch size 4096 of the tiny model at seq len 512 (one step): "About 24 min: 1 steps ×
    1.41e+03 s a step"; ten million steps: "About 2980.7 h"."""
    one = duration.estimate_from([], replace(defaults_for(False), batch_size=4096, seq_len=512),
                                 "cpu-rss", None)
    assert one.steps == 1 and one.line().startswith(f"about {duration.words(one.total_s)}: "
                                                    "1 step × 1,")
    assert "e+" not in one.line()
    many = duration.estimate_from([], replace(defaults_for(False), max_steps=10_000_000),
                                  "cpu-rss", None)
    assert many.line().startswith(f"about {many.total_s / 86400:,.0f} days: 10,000,000 steps × "
                                  f"{many.step_s:.3g} s a step")


def test_a_stored_run_of_the_same_model_times_the_next_one(store, seed):
    run_id = seed(backend="cpu-rss")  # bert-large: 8 steps in 3.21 s, training from 6.0 s
    options = replace(report(store, run_id).options, batch_size=8)
    estimate = duration.estimate(store, options, "cpu-rss", None)
    assert estimate.step_s == pytest.approx(3.21 / 8 * 2)  # no reference: twice the tokens
    assert estimate.setup_s == 6.0
    assert f"run {run_id}, which had batch size 4 (here 8), scaled to this step's tokens" in \
        estimate.line()
    same = duration.estimate(store, report(store, run_id).options, "cpu-rss", None)
    assert same.step_s == pytest.approx(3.21 / 8) and "the same options" in same.line()
    # Another device's run says nothing about this one: the reference run does.
    gpu = duration.estimate(store, options, "nvml", "NVIDIA H200")
    assert "(bert-large measured on an NVIDIA H200; no run of it is stored here yet)" in \
        gpu.line()
    unknown = duration.estimate(store, replace(options, model="bert-base-uncased"), "cpu-rss",
                                None)
    assert unknown.total_s is None and "the first steps will tell" in unknown.line()


def test_a_stopped_run_of_the_same_options_times_the_next_one(store, seed):
    """A stopped run kept no time (its Trainer never returned): the estimate took a 2-step run of
    other options over it. Its steps' time is what the recording keeps for it now."""
    other = seed(backend="cpu-rss")
    store.update_run(other, options={**store.run(other).options, "batch_size": 2})
    stopped = seed(backend="cpu-rss", status="stopped")
    store.update_run(stopped, summary=trained_until_stopped(store, stopped))
    kept = store.run(stopped).summary
    # Steps end at 6.0 + 0.4 k, training began at 6.0: 8 steps of 4 samples in 3.2 s
    assert (kept.steps, kept.time_s, kept.samples_per_second) == (8, 3.2, 10.0)
    estimate = duration.estimate(store, report(store, stopped).options, "cpu-rss", None)
    assert estimate.step_s == pytest.approx(0.4)
    assert f"run {stopped}, the same options" in estimate.line()


def test_a_run_of_a_model_folder_times_the_next_from_any_folder(store, tmp_path, monkeypatch):
    """A run started as `--model ./my-model` (stored as typed) was no basis for the form's
    "/home/me/my-model", nor for the same `./my-model` typed in another folder: "no run of it
    is stored here yet". A run stores its files' absolute paths (RunOptions.located)."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(models.resolve("tiny").config_path.read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    typed = replace(defaults_for(False), model="./my-model", max_steps=8)
    stored = typed.located()
    assert stored.model == str(model) and stored.located() == stored
    run_id = store.create_run(stored.to_dict(), "cpu-rss", "rss", 0, {"gpu_name": None})
    store.update_run(run_id, summary={"time_s": 4.0, "steps": 8})
    store.finish(run_id, "completed")
    for folder, name in ((tmp_path, "./my-model"), (tmp_path, str(model)),
                         (tmp_path / "elsewhere", "../my-model")):
        monkeypatch.chdir(folder)
        estimate = duration.estimate(store, replace(typed, model=name), "cpu-rss", None)
        assert estimate.step_s == pytest.approx(0.5), (folder, name, estimate.line())
        assert f"run {run_id}, the same options" in estimate.line()
    # Presets, Hub ids and paths that are not there stay as given.
    for name in ("tiny", "org/model", "./gone"):
        assert replace(typed, model=name).located().model == name
    assert replace(typed, dataset="gone.jsonl", tokenizer="tok").located().dataset == "gone.jsonl"


def test_the_estimate_is_made_from_a_run_of_as_many_processes_and_names_how_it_differs(store,
                                                                                     seed):
    """A 2-process run is no basis for one process; a run of other steps or data is said to
    differ, never called "the same options"."""
    run_id = seed(backend="cpu-rss")  # bert-large, max_steps 8: 8 steps in 3.21 s
    ran = report(store, run_id).options
    two = duration.estimate(store, replace(ran, processes=2), "cpu-rss", None)
    assert two.step_s is None and f"run {run_id}" not in two.line()  # nothing alike stored
    # ... and says why, not "no run of this model was measured" beside a stored one.
    assert "the runs of it stored here differ in processes" in two.line()
    assert "no run of this model" not in two.line()
    longer = duration.estimate(store, replace(ran, max_steps=100, dataset_size=64), "cpu-rss",
                               None)
    assert longer.step_s == pytest.approx(3.21 / 8)  # the steps' count leaves a step's time
    assert f"run {run_id}, which had dataset size 512 (here 64), max steps 8 (here 100)" in \
        longer.line()
    assert "the same options" not in longer.line()
    mine = store.create_run({**ran.to_dict(), "processes": 2}, "cpu-rss", "rss", 0,
                            {"gpu_name": None, "world_size": 2})
    store.update_run(mine, summary={"time_s": 8.0, "steps": 8})
    store.finish(mine, "completed")
    both = duration.estimate(store, replace(ran, processes=2), "cpu-rss", None)
    assert both.step_s == pytest.approx(1.0) and f"(run {mine}, the same options)" in both.line()


def test_predict_shows_the_time_and_the_errors_of_the_fields_as_they_are_now(store):
    app = AppTest.from_file(APP, default_timeout=30).run()
    app.number_input(key="option_batch_size").set_value(0)
    app.button(key="predict").click().run()
    errors = [e.value for e in app.error]
    assert "0 is out of range: 1 to 4096" in errors
    assert "Fix the fields marked above." in errors  # Predict starts nothing: no "Not started"
    app.number_input(key="option_batch_size").set_value(4)
    app.button(key="predict").click().run()
    assert not app.error  # the fixed field's error is gone
    assert any(i.value.startswith("About ") and " steps × " in i.value for i in app.info)
    assert store.runs() == []


def test_a_forecast_goes_when_the_run_it_was_made_for_ends(store, seed):
    run_id = seed(status="running")  # live: its worker is this process
    app = AppTest.from_file(APP, default_timeout=30).run()
    app.button(key="predict").click().run()
    assert any(i.value.startswith("This run should need about") for i in app.info)
    store.finish(run_id, "completed")
    app.run()
    assert not any(i.value.startswith("This run should need about") for i in app.info)


def test_a_cpu_run_never_speaks_of_a_cuda_context(store, seed):
    run_id = seed(backend="cpu-rss", status="running", phases_reached=1)
    store.write(run_id, phases=[PhaseMark("end", "baseline", 1.0)])
    assert live.stage(report(store, run_id)) == (None, "loading torch (after baseline)")
    gpu = seed(status="running", phases_reached=1)
    store.write(gpu, phases=[PhaseMark("end", "baseline", 1.0)])
    assert live.stage(report(store, gpu)).words == \
        "loading torch and the CUDA context (after baseline)"


def test_the_live_page_says_a_run_is_not_found_and_names_what_it_shows(store, seed):
    app = AppTest.from_file(APP, default_timeout=30)
    app.query_params["run"] = "99999"
    app.run()
    assert [w.value for w in app.warning] == ["Run 99999 not found."]
    assert "run" not in app.query_params  # nothing shown, nothing named
    run_id = seed()
    app = AppTest.from_file(APP, default_timeout=30)
    app.query_params["run"] = str(run_id)
    app.run()
    assert not app.warning and app.query_params["run"] == str(run_id)


def test_what_fits_on_the_form_starts_nothing(store):
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.selectbox(key="option_model").set_value("tiny-gpt2")
    app.number_input(key="option_seq_len").set_value(16)
    app.button(key="what_fits").click().run()
    assert not app.exception
    assert any(info.value.startswith("Largest batch size predicted to fit this machine's")
               for info in app.info), [i.value for i in app.info]
    assert store.runs() == []


def test_what_fits_on_a_cpu_leaves_the_dashboards_own_memory_out(store, monkeypatch):
    """A run the form starts has the dashboard for its front, beside it in the RAM: in a 1.2 GiB
    container What fits? gave the CLI's answer (47 for tiny at 256 tokens), and the run at 47
    from the form was killed for memory; the page tells its own memory (here 500 MiB)."""
    from anatomy.dashboard import server
    from anatomy.engine import cgroups

    monkeypatch.setattr(cgroups, "usable_ram", lambda: int(1.2 * 2**30))  # the container's
    monkeypatch.setattr(cgroups, "anonymous_bytes", lambda pid="self": 500 * 2**20)
    server.device.clear()  # asked once a process: asked again in the container
    small = server.device()
    assert small.ram_total == int(1.2 * 2**30) and not small.has_gpu
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.number_input(key="option_seq_len").set_value(256)
    app.button(key="what_fits").click().run()
    assert not app.exception
    checked = validated({"model": "tiny", "seq_len": 256}, 0)
    said, cli = (batch_size_forecast(checked, small, front).line for front in (500 * 2**20, None))
    assert said != cli
    assert [i.value.rstrip(".") for i in app.info if i.value.startswith("Largest batch")] == [
        said[0].upper() + said[1:]]
    assert store.runs() == []


def test_the_largest_batch_size_for_the_machines_gpu():
    forecast = batch_size_forecast(validated({"model": "tiny-gpt2", "seq_len": 16}, 1), H200)
    assert forecast.line.startswith("largest batch size predicted to fit GPU 0's 140.0 GiB: ")
    assert forecast.warning is None


def test_what_fits_with_a_wrong_field_marks_it_as_predict_does(store):
    """What fits? with a batch size of 0 answered nothing at all: no forecast, no error."""
    app = AppTest.from_file(APP, default_timeout=30).run()
    app.number_input(key="option_batch_size").set_value(0)
    app.button(key="what_fits").click().run()
    assert not app.exception
    assert [e.value for e in app.error] == ["0 is out of range: 1 to 4096",
                                            "Fix the fields marked above."]
    assert store.runs() == []


# A small ResNet (transformers' ResNetConfig): a model that cannot recompute its activations.
RESNET = {"architectures": ["ResNetForImageClassification"], "model_type": "resnet",
          "num_channels": 3, "embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
          "layer_type": "basic", "hidden_act": "relu", "num_labels": 10}


def _type_model(app: AppTest, model: str) -> None:
    """`model` typed into the model field (its selectbox takes new options; AppTest picks only
    what the list holds, so the typed value is added to its list first)."""
    field = app.selectbox(key="option_model")
    field.options.append(model)
    field.set_value(model)


def test_the_error_of_a_field_the_form_no_longer_draws_is_said_in_full(store, tmp_path):
    """Checkpointing ticked, a ResNet typed in as the model, Predict: the form, sent, no longer
    draws checkpointing for that model, and the page said "Fix the fields marked above." with
    no field marked."""
    # Loaded here: transformers' checks of the config run in this process, not in a child's.
    import transformers  # noqa: F401

    folder = tmp_path / "resnet"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(RESNET))
    refused = validate(RunOptions(model=str(folder), gradient_checkpointing=True), 0)
    assert list(refused) == ["gradient_checkpointing"]
    app = AppTest.from_file(APP, default_timeout=60).run()
    _type_model(app, str(folder))
    app.checkbox(key="option_gradient_checkpointing").check()
    app.button(key="predict").click().run()
    assert not app.exception
    assert "option_gradient_checkpointing" not in [c.key for c in app.checkbox]
    # In full, led by the field's label (the form has no gradient_checkpointing)
    said = "Gradient checkpointing: " + refused["gradient_checkpointing"].split(": ", 1)[1]
    assert [e.value for e in app.error] == [said]
    # Start, with a field that is drawn wrong too: the one said in full, the other marked.
    app = AppTest.from_file(APP, default_timeout=60).run()
    _type_model(app, str(folder))
    app.checkbox(key="option_gradient_checkpointing").check()
    app.number_input(key="option_batch_size").set_value(0)
    app.button(key="start").click().run()
    assert [e.value for e in app.error] == [
        "0 is out of range: 1 to 4096",
        "Not started: " + said,
        "Not started: fix the fields marked above."]
    assert store.runs() == []


def test_what_fits_does_not_answer_for_several_processes_with_one_processs_batch_size():
    """With 4 CPU processes What fits? said "≥ 4096 (peak 13.6 GB of 21.5 GB)" of a 23.5 GiB
    machine, whose RAM the four share: one process's search, while Predict at 4096 warned of
    867 GB. Two H200s under FSDP: one unsharded process's answer."""
    for options, machine in ((RunOptions(model="tiny", processes=4), CPU),
                             (RunOptions(model="tiny", gpus="0,1", strategy="fsdp"), replace(
                                 H200, devices=(H200.devices[0], replace(H200.devices[0],
                                                                         index=1, nvml_index=1))))):
        forecast = batch_size_forecast(validated(options, machine.gpu_count), machine)
        assert forecast.line is None
        assert forecast.warning.startswith("What fits? answers for one process alone, not for "
                                           f"{options.world_size} ({options.strategy})")


def test_a_token_classifier_typed_into_the_form_is_predicted(store, token_classifier):
    """The published NER model's config (shrunk), typed in: its prediction, where the form said
    it was a head anatomy does not train. The field's help names the heads it trains."""
    # Loaded here: transformers' checks of the config run in this process, not in a child's.
    import transformers  # noqa: F401

    app = AppTest.from_file(APP, default_timeout=60).run()
    assert "token or image classifier" in app.selectbox(key="option_model").help
    _type_model(app, token_classifier)
    app.number_input(key="option_seq_len").set_value(32)
    app.button(key="predict").click().run()
    assert not app.exception and not app.error
    assert any(info.value.startswith("This run should need about") for info in app.info)
    assert store.runs() == []


def test_a_cpu_forecast_gives_the_rss_in_all_the_process_as_the_anatomy_page_measures_it(
        store, seed_users):
    """"about 99 MB … plus the Python process itself", while the Anatomy page knew the process
    (476 MiB): the form gives the total, from the same figures."""
    from anatomy.prediction import breakdown, predict
    from anatomy.units import size_text

    options = defaults_for(False)
    before = live.memory_forecast(validated(options, 0), CPU, store)  # no CPU run: tensors alone
    assert before.line.endswith("plus the Python process itself")
    run_id = seed_users("trainer")  # a CPU run with its weights measured
    expected = breakdown.cpu_peak(report(store, run_id), predict(options, device="cpu"))
    forecast = live.memory_forecast(validated(options, 0), CPU, store)
    assert forecast.line == (
        f"this run should need about {size_text(expected.rss)} of RAM in all: "
        f"{size_text(expected.tensors)} for tensors (peak: optimizer step) and "
        f"{size_text(expected.process)} for the process itself (the interpreter, torch's "
        f"libraries, the data: as run {run_id} held them before training)")
    assert expected.process == 500 * 2**20 - report(store, run_id).components.weights


def test_the_forms_forecast_of_a_quantized_models_config_says_it_is_unquantized(store, tmp_path):
    """A config as transformers saves a model loaded in 4 bits: the forecast is of the weights
    unquantized (as the run trains them), and says so."""
    from transformers import BitsAndBytesConfig, LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=128)
    config.quantization_config = BitsAndBytesConfig(load_in_4bit=True)
    config.save_pretrained(tmp_path / "qlora-base")
    options = replace(defaults_for(False), model=str(tmp_path / "qlora-base"), seq_len=16)
    forecast = live.memory_forecast(validated(options, 0), CPU, store)
    assert forecast.line.endswith("itself. The config's quantization_config "
                                  "(bitsandbytes, 4-bit) is left out: the weights are "
                                  "unquantized"), forecast.line
    plain = live.memory_forecast(validated(replace(options, model="tiny"), 0), CPU, store)
    assert "quantization" not in plain.line
