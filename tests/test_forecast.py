"""The Live page's additions: the memory forecast before a run, and a stored run shown by its id."""

from __future__ import annotations

import os

from streamlit.testing.v1 import AppTest

from anatomy.analysis.machine import Device, Machine
from anatomy.analysis.options import RunOptions, defaults_for
from anatomy.views.session import Forecast, batch_size_forecast, memory_forecast

H200 = Machine(backend="nvml", memory_api="v2",
               devices=(Device(index=0, nvml_index=0, name="NVIDIA H200", uuid=None,
                               total=140 * 2**30, memory_api="v2"),),
               driver=None, cuda_driver=None, ram_total=2 * 2**40, why_no_gpu=None)


def test_the_walkthrough_run_fits_an_h200():
    forecast = memory_forecast(RunOptions(preset="bert-large-uncased", batch_size=4), H200)
    assert forecast.line.startswith("this run should need about 7.0 GB of GPU memory")
    assert forecast.warning is None


def test_a_batch_too_large_for_the_gpu_is_warned():
    forecast = memory_forecast(RunOptions(preset="bert-large-uncased", batch_size=256), H200)
    assert "more than GPU 0's 140.0 GiB" in forecast.warning


def test_wrong_options_get_no_forecast():
    assert memory_forecast(RunOptions(batch_size=0), H200) == Forecast(line=None, warning=None)


def test_predict_memory_on_the_form_starts_nothing(store):
    app = AppTest.from_file("../app.py", default_timeout=30).run()
    app.button(key="predict").click().run()
    assert not app.exception
    assert any(info.value.startswith("This run should need about") and "MB of CPU memory"
               in info.value for info in app.info)
    assert store.runs() == []


def test_the_live_page_shows_a_stored_run_by_its_id(store, seed):
    run_id = seed()
    app = AppTest.from_file("../app.py", default_timeout=30)
    app.query_params["run"] = str(run_id)
    app.run()
    assert not app.exception
    assert app.subheader[0].value.startswith(f"Run {run_id}:")


def test_start_is_refused_while_a_sweep_holds_the_device(store):
    from pages import common

    # What a sweep does for its whole length (engine/sweep.py): the device's lock, in its name.
    lock = common.manager().reserve(defaults_for(common.device().has_gpu), "a sweep")
    lock.describe(f"sweep 7 (pid {os.getpid()})")
    try:
        app = AppTest.from_file("../app.py", default_timeout=30).run()
        app.button(key="start").click().run()
    finally:
        lock.release()
    assert not app.exception
    assert any(e.value.startswith("Not started: ") and f"is busy: sweep 7 (pid {os.getpid()})"
               in e.value for e in app.error), [e.value for e in app.error]
    assert store.runs() == []


def test_what_fits_on_the_form_starts_nothing(store):
    app = AppTest.from_file("../app.py", default_timeout=120).run()
    app.selectbox(key="option_model").set_value("tiny-gpt2")
    app.number_input(key="option_seq_len").set_value(16)
    app.button(key="what_fits").click().run()
    assert not app.exception
    assert any(info.value.startswith("Largest batch size predicted to fit this machine's")
               for info in app.info), [i.value for i in app.info]
    assert store.runs() == []


def test_the_largest_batch_size_for_the_machines_gpu():
    forecast = batch_size_forecast(RunOptions(model="tiny-gpt2", seq_len=16), H200)
    assert forecast.line.startswith("largest batch size predicted to fit GPU 0's 140.0 GiB: ")
    assert forecast.warning is None
