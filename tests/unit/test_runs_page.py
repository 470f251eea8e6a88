"""The Runs page's admin: filtering the list by tag, preset and status; naming and tagging a run
(deleting is in test_live_page.py)."""

from __future__ import annotations

import html

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis.report import report
from anatomy.views import text
from tests.apptest import chart_spec, open_page


def _page(**query) -> AppTest:
    return open_page("screens/runs.py", **query)


def test_the_list_filters_by_tag_preset_and_status(store, seed):
    first, second, failed = seed(), seed(), seed(status="oom")
    store.set_tags(first, ["baseline", "h200"])
    store.set_tags(failed, ["h200"])
    store.update_run(second, preset="bert-base-uncased")
    app = _page()
    assert app.selectbox(key="runs_filter_tag").options == ["any", "baseline", "h200"]
    assert list(app.dataframe[0].value["Run"]) == [failed, second, first]

    app.selectbox(key="runs_filter_tag").set_value("h200").run()
    assert list(app.dataframe[0].value["Run"]) == [failed, first]
    app.selectbox(key="runs_filter_status").set_value("completed").run()
    assert list(app.dataframe[0].value["Run"]) == [first]
    assert app.selectbox(key="runs_select").value == first

    app.selectbox(key="runs_filter_preset").set_value("bert-base-uncased").run()
    assert "No stored run matches these filters." in [i.value for i in app.info]


def test_a_run_is_named_and_tagged_from_the_page(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    app.text_input(key=f"run_name_{run_id}").set_value("walkthrough, fp32")
    app.text_input(key=f"run_tags_{run_id}").set_value("baseline, h200 ,, baseline")
    app.button(key=f"FormSubmitter:run_labels_{run_id}-Save").click().run()
    assert not app.exception
    run = store.run(run_id)
    assert (run.name, run.tags) == ("walkthrough, fp32", ("baseline", "h200"))
    table = app.dataframe[0].value
    assert table["Name"].tolist() == ["walkthrough, fp32"]
    assert list(table["Tags"].iloc[0]) == ["baseline", "h200"]

    app.text_input(key=f"run_name_{run_id}").set_value("  ")
    app.button(key=f"FormSubmitter:run_labels_{run_id}-Save").click().run()
    assert store.run(run_id).name is None  # an empty name removes it


def test_saving_the_labels_of_a_run_deleted_meanwhile_says_nothing_was_saved(store, seed):
    """Another tab (or `anatomy delete`) deleted the run shown; its Save said "Run N saved"."""
    run_id, other = seed(), seed()
    app = _page(run=str(run_id))
    store.delete_run(run_id)
    app.text_input(key=f"run_name_{run_id}").set_value("kept?")
    app.button(key=f"FormSubmitter:run_labels_{run_id}-Save").click().run()
    assert not app.exception
    assert [t.value for t in app.toast] == [f"Run {run_id} is not stored any more: nothing was"
                                            " saved"]
    assert store.run(other).name is None


@pytest.mark.parametrize("page", ["runs", "anatomy", "live"])
def test_a_run_deleted_elsewhere_while_shown_is_said_not_swapped_silently(store, seed, page):
    """Another tab (or `anatomy delete`) deleted the run this tab showed: its next rerun showed
    another run in its place (the Live page: none), unsaid."""
    other, run_id = seed(), seed()
    app = open_page(f"screens/{page}.py", run=str(run_id))
    store.delete_run(run_id)
    app.run()
    assert not app.exception
    gone = f"Run {run_id} is no longer stored (deleted in another tab or by the CLI)"
    said = gone + "." if page == "live" else f"{gone}: showing run {other}."
    assert said in [w.value for w in app.warning]


def test_a_label_that_is_not_one_line_of_printable_text_is_said_and_not_saved(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    app.text_input(key=f"run_name_{run_id}").set_value("red\x1b[31m")
    app.button(key=f"FormSubmitter:run_labels_{run_id}-Save").click().run()
    assert not app.exception
    assert [t.value for t in app.toast] == [
        "Not saved: name: holds the control character '\\x1b': give one line of printable text"]
    assert store.run(run_id).name is None


def test_a_runs_chart_and_its_export_are_a_click_away(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    labels = [b.proto.label for b in app.get("download_button")]
    assert labels == ["Chart (HTML)", "Run (JSON)"]


def test_a_run_id_that_is_not_stored_is_said_and_the_url_names_the_run_shown(store, seed):
    first, deleted, last = seed(), seed(), seed()
    store.delete_run(deleted)
    for asked, said in ((str(deleted), f"Run {deleted} not found: showing run {last}."),
                        ("99999", f"Run 99999 not found: showing run {last}."),
                        ("abc", f"'abc' is not a run id: showing run {last}.")):
        app = _page(run=asked)
        assert [w.value for w in app.warning] == [said]
        assert app.selectbox(key="runs_select").value == last
        assert app.query_params["run"] == str(last)  # the URL names what is shown
    app = _page(run=str(first))
    assert not app.warning and app.query_params["run"] == str(first)


def test_after_a_filter_the_url_names_the_run_shown(store, seed):
    kept, failed = seed(), seed(status="oom")
    app = _page(run=str(kept))
    app.selectbox(key="runs_filter_status").set_value("oom").run()
    assert [w.value for w in app.warning] == [
        f"Run {kept} is not among the runs these filters keep: showing run {failed}."]
    assert app.query_params["run"] == str(failed)
    app.run()  # said once: the URL already names the run shown
    assert not app.warning


def test_selected_rows_are_compared_in_one_click(store, seed):
    first, _, third = seed(), seed(), seed()
    app = _page()
    assert app.button(key="compare_selected").disabled
    app.session_state["runs_table"] = {"selection": {"rows": [0, 2], "columns": [], "cells": []}}
    app.run()
    assert not app.button(key="compare_selected").disabled
    app.button(key="compare_selected").click().run()
    assert not app.exception
    assert app.title[0].value == "Compare"
    assert app.multiselect(key="compare_runs").value == [third, first]


def test_one_selected_row_is_the_run_shown(store, seed):
    first, second = seed(), seed()
    app = _page()
    assert app.selectbox(key="runs_select").value == second
    app.session_state["runs_table"] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    app.run()
    assert app.selectbox(key="runs_select").value == first
    assert app.query_params["run"] == str(first)


def test_peak_memory_against_speed_over_the_runs(store, seed):
    fast = seed()
    bf16 = seed()
    store.update_run(bf16, options={**store.run(bf16).options, "precision": "bf16",
                                    "batch_size": 8})
    seed(status="oom")  # no speed: not a point
    stopped = seed(status="stopped")  # a speed of its first steps: not a point either
    store.update_run(stopped, summary={"time_s": 1.5, "samples_per_second": 2.5, "steps": 2})
    chart = chart_spec(_page(), "runs_efficiency")
    points = {t["name"]: t for t in chart["data"]}
    assert set(points) == {"fp32 · NVIDIA H200", "bf16 · NVIDIA H200"}
    assert points["bf16 · NVIDIA H200"]["text"] == ["bs 8"]
    assert points["fp32 · NVIDIA H200"]["x"] == [9.97] and points["fp32 · NVIDIA H200"]["y"] == [
        4096]
    assert fast != bf16


def test_yes_delete_is_not_the_green_of_start(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    app.button(key="delete").click().run()
    assert app.button(key="delete_yes").proto.type != "primary"  # primary is the theme's green
    from anatomy.dashboard.widgets import STYLE
    assert ".st-key-delete_yes button { background-color: #B3261E" in STYLE


def test_every_run_picker_names_the_device_first(store, seed):
    gpu, cpu = seed(), seed(backend="cpu-rss")
    app = _page()
    labels = app.selectbox(key="runs_select").options
    assert labels[0].startswith(f"{cpu} · CPU · ") and labels[1].startswith(f"{gpu} · NVIDIA H200 · ")


def test_the_columns_that_tell_the_runs_apart_come_first_and_the_rest_wait_in_the_toolbar(
        store, seed):
    """At 1,000 px the table's 19 columns (2,007 px) needed a sideways scroll in its 538 px:
    those that fit are the run, its peak and what tells the runs listed apart; the others are
    hidden, a click away in the table's toolbar."""
    import json

    from anatomy.analysis.report import run_rows
    from anatomy.dashboard.widgets import TABLE_PX, _widths
    from anatomy.views import runs as runs_view

    seed()
    second = seed()
    store.update_run(second, options={**store.run(second).options, "batch_size": 8})
    table = runs_view.table(run_rows(store))
    order = runs_view.by_use(table)
    assert sorted(order) == sorted(table[0])  # every column, in the order it earns a place
    assert order[:5] == ["Run", "Name", "Model", "Status", "Peak (MiB)"]
    assert order.index("Batch") < order.index("Device")  # they differ in batch, not in device
    assert order.index("Tags") > order.index("Optimizer")  # no run has a tag: last

    config = json.loads(_page().dataframe[0].proto.columns)
    shown = [name for name in order if not config.get(name, {}).get("hidden")]
    assert shown == order[:len(shown)] and "Batch" in shown  # the first ones, all of them
    widths = _widths(table, runs_view.WIDEST)
    assert sum(widths[name] for name in shown) <= TABLE_PX < sum(
        widths[name] for name in order[:len(shown) + 1])


def test_every_runs_name_and_model_are_shown_whatever_else_the_table_holds(store, seed):
    """"my Mistral (Trainer)" and a debug run looked alike: their names and models hid behind the
    table's column menu, the other columns having taken the room first."""
    import json

    from anatomy.views import runs as runs_view

    named = seed()
    store.rename_run(named, "my Mistral (Trainer), dynamic padding, logging every 5 steps")
    store.update_run(named, options={**store.run(named).options,
                                     "model": "/home/me/experiments/configs/my-mistral.json"})
    debug = seed()
    store.update_run(debug, options={**store.run(debug).options, "batch_size": 8,
                                     "seq_len": 128, "precision": "bf16"})
    app = _page()
    config = json.loads(app.dataframe[0].proto.columns)
    for heading in ("Name", "Model"):
        assert not config.get(heading, {}).get("hidden"), heading
        assert config[heading]["width"] <= runs_view.WIDEST[heading]
    table = app.dataframe[0].value
    assert table["Model"].tolist() == ["bert-large-uncased", "my-mistral"]
    assert table["Name"].tolist()[1].startswith("my Mistral")


def test_which_runs_failed_is_shown_whatever_else_the_table_holds(store, seed):
    """A sweep's runs, named at length, of a model class's long name: the Status column (and the
    peak after it) hid behind the table's column menu, and a user could not see which run failed
    without opening each."""
    import json

    ok, failed = seed(), seed(status="oom")
    for run_id, name in ((ok, "bert-large sweep point 0 with a longer name"),
                         (failed, "bert-large sweep point 1 with a longer name")):
        store.rename_run(run_id, name)
        store.update_run(run_id, options={**store.run(run_id).options,
                                          "model": "BertForSequenceClassification"})
    app = _page()
    config = json.loads(app.dataframe[0].proto.columns)
    for heading in ("Run", "Name", "Model", "Status", "Peak (MiB)"):
        assert not config.get(heading, {}).get("hidden"), heading
    assert app.dataframe[0].value["Status"].tolist() == ["oom", "completed"]


def test_the_option_two_runs_differ_in_is_shown_before_what_they_measured(store, seed):
    """A LoRA run beside the same model trained whole (seen in Chromium at 1,000 px): the table
    showed their speed and time, which differ between any two runs, and hid the LoRA rank, the
    one option that told them apart."""
    import json

    whole, lora = seed(), seed()
    store.update_run(lora, options={**store.run(lora).options, "lora_rank": 8})
    store.update_run(lora, summary={"time_s": 1.5, "samples_per_second": 20.5, "steps": 8})
    config = json.loads(_page().dataframe[0].proto.columns)
    assert not config.get("LoRA rank", {}).get("hidden")
    assert whole != lora


def test_a_run_without_a_sample_says_so_instead_of_an_empty_chart(store):
    """A run that failed before its sampler's first reading (/runs?run=N, /?run=N): the memory
    chart was an empty pair of axes from 0 to 1, with the caption of a curve it did not have."""
    run_id = store.create_run({"model": "tiny"}, "cpu-rss", "rss", 0, {"gpu_name": None})
    store.finish(run_id, "failed", "killed by SIGKILL")
    for page in ("screens/runs.py", "screens/live.py"):
        app = open_page(page, interactive=False, run=str(run_id))
        assert "No memory sample was stored for this run: it ended before its sampler's first " \
               "reading, so there is no curve to draw." in [i.value for i in app.info]
        # Neither the picture nor its caption ("A picture: … Shows RSS …").
        assert not any("Shows " in c.value for c in app.caption)


def test_a_long_error_is_wrapped_not_cut(store, seed):
    """"ended without a word (its processes are gone); what it recorded is kept" was cut at
    "recorde" at 1,000 px: a code block keeps its lines whole unless told to wrap them."""
    run_id = seed(status="failed", error="ended without a word (its processes are gone); what "
                                          "it recorded is kept")
    for page in ("screens/runs.py", "screens/live.py"):
        app = open_page(page, interactive=False, run=str(run_id))
        (error,) = [c for c in app.code if c.value.startswith("ended without a word")]
        assert error.proto.wrap_lines


NAME = "**v2** [notes](http://example.com) $x^2$ ~~old~~ a_b `c` C:\\runs :red[r]"


def test_a_runs_name_and_a_word_of_the_url_are_shown_as_typed_not_as_markup(store, seed):
    """A run named "**v2** [notes](http://…) $x^2$ …": its heading showed a bold "v2", a link and
    a formula; /runs?run=[x](http://…) put a link in the page's warning."""
    from markdown_it import MarkdownIt

    commonmark = MarkdownIt("commonmark").enable("strikethrough")
    assert commonmark.renderInline(text.literal(NAME)) == html.escape(NAME, quote=False)
    assert "\\$x^2\\$" in text.literal(NAME)  # Streamlit's math, which CommonMark has not
    assert "\\:red\\[r\\]" in text.literal(NAME)  # Streamlit's colour directive, likewise
    run_id = seed()
    store.rename_run(run_id, NAME)
    for page in ("screens/runs.py", "screens/live.py", "screens/anatomy.py"):
        app = open_page(page, interactive=False, run=str(run_id))
        heading = report(store, run_id).title()
        assert heading.startswith(f"Run {run_id}: {NAME}")
        assert text.literal(heading) in [h.value for h in app.subheader], page
    app = open_page("screens/runs.py", interactive=False, run="[x](http://example.com)")
    (warning,) = [w.value for w in app.warning]
    assert commonmark.renderInline(warning) == \
        f"'[x](http://example.com)' is not a run id: showing run {run_id}."


def test_peak_against_speed_without_a_point_says_why_instead_of_empty_axes(store, seed,
                                                                          seed_users):
    """Two watched commands and a failed run: the open "Peak memory against speed" drew an
    empty pair of axes under "A point per completed run of the list above"."""
    seed_users("command"), seed_users("command"), seed(status="failed")
    app = open_page("screens/runs.py", interactive=False)
    assert any(i.value.startswith("No run of this list has both a peak and a speed")
               for i in app.info)
    assert not any(c.value.startswith("A point per completed run") for c in app.caption)
    seed()  # a completed run: its point, and the caption
    app = open_page("screens/runs.py", interactive=False)
    assert not any(i.value.startswith("No run of this list has both") for i in app.info)
    assert any(c.value.startswith("A point per completed run") for c in app.caption)


def test_a_run_another_process_is_recording_cannot_be_deleted(store, seed):
    """A run in progress from `anatomy run` or a script (its recorder alive: here, this process)
    had Delete enabled on the Runs page, which checked only the runs this server started; a click
    pulled the rows from under the recording."""
    recording = seed(status="running")
    app = open_page("screens/runs.py", interactive=False, run=str(recording))
    assert app.button(key="delete").disabled
    store.finish(recording, "completed")  # ended: deleting is the user's to choose again
    app = open_page("screens/runs.py", interactive=False, run=str(recording))
    assert not app.button(key="delete").disabled


def test_the_table_names_each_runs_data_as_anatomy_runs_does(store, seed):
    """`anatomy runs` named each run's data; the page's table had no column for it: the file or
    folder name, cut in its middle past 24 characters (one function for both), none for a run
    on the dummy data."""
    dummy, short, long = seed(), seed(), seed()
    for run_id, path in ((short, "/home/me/data/reviews.jsonl"),
                         (long, "/home/me/data/customer-reviews-2024-q3-cleaned.jsonl")):
        store.update_run(run_id, options={**store.run(run_id).options, "dataset": path})
    table = _page().dataframe[0].value
    assert table["Data"].fillna("").tolist() == ["customer-re…leaned.jsonl", "reviews.jsonl", ""]
    assert text.data_name("/home/me/data/customer-reviews-2024-q3-cleaned.jsonl") == \
        "customer-re…leaned.jsonl"
    assert dummy < short < long
