"""The Runs page's admin: filtering the list by tag, preset and status; naming and tagging a run
(deleting is in test_app.py)."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.apptest import open_page


def _page(**query) -> AppTest:
    return open_page("pages/runs.py", **query)


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


def test_a_runs_chart_and_its_export_are_a_click_away(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    labels = [b.proto.label for b in app.get("download_button")]
    assert labels == ["Chart (HTML)", "Run (JSON)"]
