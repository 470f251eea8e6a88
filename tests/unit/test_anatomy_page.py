"""The Anatomy page: measured next to predicted, the peak below the sum of the parts, bytes per
parameter, the first steps and the operation classes, through AppTest on seeded runs; and
anatomy/views/anatomy.py and its figures without Streamlit."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis.operations import CLASSES, ClassTotals, OperationProfile
from anatomy.analysis.report import report
from anatomy.dashboard.widgets import INTERACTIVE
from anatomy.prediction import breakdown, device_constants
from anatomy.units import MIB, mib_text
from anatomy.views import anatomy as view
from anatomy.views import text
from anatomy.views.figures import anatomy as figures
from tests.apptest import APP, chart_spec, open_page


def _measured_like(prediction, activations_off: float = 0.01) -> dict:
    """Components as the worker stores them on a GPU: the prediction's, activations 1% higher."""
    peak = prediction.peak + 2 * MIB
    return {"weights": prediction.weights, "gradients": prediction.gradients,
            "optimizer_states": prediction.optimizer_states,
            "activations": round(prediction.activations * (1 + activations_off)),
            "peak_allocated": peak, "peak_reserved": peak + 600 * MIB,
            "allocator_cache": 600 * MIB,
            "moments": {"end of forward": prediction.marks["end of forward"] + MIB,
                        "end of backward": prediction.marks["end of backward"] - MIB,
                        "after optimizer step": prediction.marks["after optimizer step"]},
            "steps_measured": 3}


def _profile(device: str = "cuda") -> dict:
    shares = {CLASSES[0]: (900.0, 10**12), CLASSES[1]: (40.0, 10**9), CLASSES[2]: (30.0, 10**8),
              CLASSES[3]: (30.0, 0)}
    classes = {k: ClassTotals(time_us=t, flops=f, count=10) for k, (t, f) in shares.items()}
    operators = [{"name": f"aten::op{i}", "class": CLASSES[i % 4], "time_us": 100.0 - i,
                  "flops": 0, "count": 1} for i in range(12)]
    return OperationProfile(device, "GPU kernel time (self)", 3, classes, operators,
                            ClassTotals(time_us=21.0)).to_dict()


@pytest.fixture
def measured_run(store, seed):
    """A GPU run of bert-large (batch 4, 512 tokens) with measured components and a profile."""
    run_id = seed()
    prediction = breakdown.prediction_for(report(store, run_id))
    store.merge_environment(run_id, {"parameters": prediction.parameters})
    summary = store.run(run_id).summary
    store.update_run(run_id, summary={**summary.to_dict(), "components": _measured_like(prediction),
                                      "operations": _profile()})
    return run_id


def _page(**query) -> AppTest:
    # The page traces a training step to predict it: seconds, minutes on a loaded machine.
    return open_page("screens/anatomy.py", timeout=300, **query)


# The page's dataframes, in the order it draws them; the components' table is static (its notes
# wrap).
TABLES = ("bytes_per_parameter", "top_operators")


def _table(app: AppTest, name: str):
    if name == "components":
        return app.table[0].value
    return app.dataframe[TABLES.index(name)].value


# --- the page ---

def test_measured_next_to_predicted_with_the_error_of_each_component(store, seed, measured_run):
    seed()  # a later run: the URL still picks the measured one
    app = _page(run=str(measured_run))
    assert app.selectbox(key="anatomy_run").value == measured_run
    table = _table(app, "components").set_index("Component")
    assert list(table.index) == [
        "CUDA context", "weights", "gradients", "optimizer states", "activations",
        "temporary buffers", "sum of the parts", "peak (tensors)", "allocator cache",
        "outside PyTorch", "peak (NVML, over the baseline)"]
    assert table.loc["weights", "Error (%)"] == 0
    assert table.loc["optimizer states", "Measured (MiB)"] == pytest.approx(2556.9, abs=0.1)
    assert table.loc["activations", "Error (%)"] == pytest.approx(-100 * 0.01 / 1.01, abs=1e-3)
    # the traced prediction with the H200's calibration (calibration/nvidia-h200.json), with
    # CUDA's reduction and softmax temporaries since c993847 (the H200 measured 7,158.6 MiB:
    # docs/MEASUREMENTS.md; 7,143.8 before them, 7,159.8 before the trace followed the H200's
    # recorded actions at the edge: gradients summed in place, cuBLAS's two workspaces)
    assert table.loc["peak (tensors)", "Predicted (MiB)"] == pytest.approx(7158.8, abs=0.1)
    assert table.loc["CUDA context", "Measured (MiB)"] == 1024  # seeded: kernel − baseline
    context = device_constants.load("NVIDIA H200").context_bytes / MIB  # the GPU's constant
    assert table.loc["CUDA context", "Predicted (MiB)"] == pytest.approx(context, abs=0.05)
    assert table.loc["peak (NVML, over the baseline)", "Predicted (MiB)"] > \
        table.loc["peak (tensors)", "Predicted (MiB)"] + context

    sides = {t["name"]: t for t in chart_spec(app, "anatomy_waterfall")["data"]}
    assert set(sides) == {"measured", "predicted"}
    measured = dict(zip(sides["measured"]["x"], sides["measured"]["y"]))
    # Activations outweigh gradients: the gradients are what the peak never holds with them.
    assert measured["never held at once"] == pytest.approx(-1278.47, abs=0.01)
    assert sides["measured"]["x"][-1] == "peak (NVML)"
    assert sides["predicted"]["x"][-1] == "peak (NVML)"  # predicted from context to NVML too


def test_the_page_says_why_the_peak_is_below_the_sum_of_the_parts(store, measured_run):
    app = _page(run=str(measured_run))
    words = " ".join(m.value for m in app.markdown)
    assert "no moment of a step holds them all" in words
    assert "in the backward pass" in words
    moments = chart_spec(app, "anatomy_moments")
    bars = {t["name"]: t for t in moments["data"]}
    assert bars["predicted"]["x"] == ["end of the forward pass", "end of the backward pass",
                                      "after the optimizer step", "peak (backward pass)"]
    assert None not in bars["measured"]["y"]  # every moment the probe reads, and the peak
    line = moments["layout"]["shapes"][0]
    assert line["y0"] > max(bars["predicted"]["y"])  # no moment reaches the sum of the parts


def _measured_as_predicted(store, seed) -> int:
    """A CPU run whose measured components are its prediction's (no temporaries measured)."""
    run_id = seed(backend="rss")
    prediction = breakdown.prediction_for(report(store, run_id))
    summary = store.run(run_id).summary
    store.update_run(run_id, summary={**summary.to_dict(), "components": {
        "weights": prediction.weights, "gradients": prediction.gradients,
        "optimizer_states": prediction.optimizer_states, "activations": prediction.activations,
        "steps_measured": 2}})
    return run_id


def test_the_explanation_adds_up_the_parts_the_table_sums(store, seed):
    """Without measured temporaries (a CPU run) the table's sum of the parts leaves them out on
    both sides, and the words under "Why the peak is less than the sum of the parts" added them
    in: two sums of the parts on one page (a CPU run of a 24-layer Qwen2: 250 MiB in the table,
    252 in the words)."""
    run_id = _measured_as_predicted(store, seed)
    rep = report(store, run_id)
    prediction = breakdown.prediction_for(rep)
    rows = {row.component: row for row in view.component_rows(rep, prediction)}
    summed = rows["sum of the parts"].predicted
    assert summed != prediction.as_components().sum_of()  # the temporaries, left out
    assert f"the parts come to {mib_text(summed)} (predicted)" in \
        view.peak_explanation(rep, prediction)
    assert view.predicted_sum_of_parts(rep, prediction) == summed  # the moments' line


def test_a_peak_above_the_sum_of_the_parts_is_said_so(store, seed):
    """A peak above the parts (a CPU run's, whose parts leave the step's temporaries out: 6.9 MiB
    of parts, a peak of 7.1) was told as "the peak holds only the larger of the two" under "Why
    the peak is less than the sum of the parts", contradicting the table beside it."""
    import dataclasses

    run_id = seed(backend="rss")
    prediction = breakdown.prediction_for(report(store, run_id))
    summary = store.run(run_id).summary  # measured without temporaries, as a CPU's probe does
    store.update_run(run_id, summary={**summary.to_dict(), "components": {
        "weights": prediction.weights, "gradients": prediction.gradients,
        "optimizer_states": prediction.optimizer_states, "activations": prediction.activations,
        "steps_measured": 2}})
    rep = report(store, run_id)
    summed = view.predicted_sum_of_parts(rep, prediction)
    below = dataclasses.replace(prediction, peak=summed - 2**20)
    assert view.peak_title(rep, below) == "Why the peak is less than the sum of the parts"
    assert "only the larger of the two" in view.peak_explanation(rep, below)
    above = dataclasses.replace(prediction, peak=summed + 2**20)
    assert view.peak_title(rep, above) == "Why the peak is more than the sum of the parts"
    words = view.peak_explanation(rep, above)
    assert f"the peak, {mib_text(summed + 2**20)} in the {above.peak_at}, is more" in words
    assert "only the larger of the two" not in words


def test_a_peak_a_fraction_of_a_mib_above_the_parts_is_not_said_equal_to_them(store, seed):
    """A user's small Qwen3 on the CPU (seen in Chromium): "Added up, the parts come to 5 MiB
    (predicted); the peak, 5 MiB in the backward pass, is more" (5.5 and 5.96 MiB, each rounded
    down), beside a table and a chart that say 5.5 and 6.0."""
    import dataclasses

    run_id = _measured_as_predicted(store, seed)
    rep = report(store, run_id)
    prediction = breakdown.prediction_for(rep)
    summed = view.predicted_sum_of_parts(rep, prediction)
    whole = summed // 2**20 * 2**20  # the parts a tenth of a MiB over a whole MiB, the peak more
    parts = dataclasses.replace(prediction, peak=whole + 2**20 * 9 // 10)
    parts = dataclasses.replace(parts, weights=parts.weights - (summed - whole - 2**20 // 10))
    summed = view.predicted_sum_of_parts(rep, parts)
    assert mib_text(summed) == mib_text(parts.peak) and summed < parts.peak
    words = view.peak_explanation(rep, parts)
    assert (f"the parts come to {summed / 2**20:,.1f} MiB (predicted); the peak, "
            f"{parts.peak / 2**20:,.1f} MiB in the {parts.peak_at}, is more") in words


def test_bytes_per_parameter_next_to_the_walkthroughs(store, measured_run):
    table = _table(_page(run=str(measured_run)), "bytes_per_parameter").set_index("Component")
    assert table["This run (measured)"].tolist() == [4.0, 4.0, 8.0, 16.0]
    assert table["The walkthrough"].tolist() == [4.0, 4.0, 8.0, 16.0]
    # Short labels: "weights + gradients + optimizer states" pushed "The walkthrough" out of a
    # 1,000 px window (the table scrolled).
    assert max(len(name) for name in table.index) <= len("optimizer states")


def test_the_first_steps_are_marked_on_the_curve(store, measured_run):
    chart = chart_spec(_page(run=str(measured_run)), "anatomy_first_steps")
    lines = [s["x0"] for s in chart["layout"]["shapes"]]
    assert lines == [6.0, 6.4, 6.8, pytest.approx(7.2)]  # training begins, steps 1-3 end
    notes = {a["text"]: a for a in chart["layout"]["annotations"] if a.get("showarrow")}
    assert set(notes) == {"after step 1: gradients and optimizer states exist",
                          "from step 2 on, the memory repeats"}
    for note in notes.values():  # every arrow ends on the curve, none in empty space
        assert note["y"] == 4096 and note["x"] in (6.4, pytest.approx(7.2))
    # The note at the right of the chart opens to the left: nothing is cut at the edge.
    right = notes["from step 2 on, the memory repeats"]
    assert right["ax"] < 0 and right["xanchor"] == "right"
    assert _notes_outside(chart) == []
    labels = [a for a in chart["layout"]["annotations"] if not a.get("showarrow")]
    assert [a["text"] for a in labels] == ["training begins", "step 1 ends", "step 2 ends",
                                           "step 3 ends"]
    assert chart["layout"]["xaxis"]["range"][1] < 9.0  # zoomed on the first steps


def _notes_outside(chart: dict) -> list[str]:
    """The arrowed notes whose text leaves the plot at the narrowest it is drawn."""
    from anatomy.views.figures.layout import ASSUMED_PLOT_PX, CHAR_PX

    x0, x1 = chart["layout"]["xaxis"]["range"]
    outside = []
    for note in (a for a in chart["layout"]["annotations"] if a.get("showarrow")):
        tail = (note["x"] - x0) / (x1 - x0) * ASSUMED_PLOT_PX + note["ax"]
        width = len(note["text"]) * CHAR_PX + 8
        left = tail - width if note["xanchor"] == "right" else tail
        if left < 0 or left + width > ASSUMED_PLOT_PX:
            outside.append(note["text"])
    return outside


def test_a_run_whose_batches_differ_in_length_is_not_said_to_repeat(store, seed_users):
    """A Trainer padding each batch to its longest example: its memory climbed from step to step,
    and the page said "from step 2 on, the memory repeats"; its "after step 1…" note ran past the
    chart's edge."""
    import sqlite3

    from anatomy.store import Sample

    run_id = seed_users("trainer")  # 8 steps, 0.3 s apart from 6.3 s
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE steps SET seq_len = 16 * step WHERE run_id = ?", (run_id,))
    # Each step's peak as long as its batch: 40 MiB more a step.
    store.write(run_id, samples=[Sample(5.85 + 0.3 * k, 0, (720 + 40 * k) * 2**20, None, None,
                                        None) for k in range(1, 9)])
    rep = report(store, run_id)
    samples, steps = store.samples(run_id, rep.gpu), store.steps(run_id)
    repeated = view.repetition(rep, samples, steps)
    assert repeated == view.Repetition(False, 800 * 2**20, 1040 * 2**20, (32, 128))
    caption = view.first_steps_caption(rep, repeated)
    assert "repeats" not in caption
    assert ("From step 2 on the memory does not repeat: its steps peak at 800 MiB to 1,040 MiB, as "
            "each batch is as long as its longest example (32 to 128 tokens).") in caption
    chart = figures.first_steps_figure(rep, samples, steps, repeated=repeated).to_plotly_json()
    notes = [a["text"] for a in chart["layout"]["annotations"] if a.get("showarrow")]
    assert notes == ["after step 1: gradients and optimizer states exist",
                     "from step 2 on, the memory follows each batch's length"]
    assert _notes_outside(chart) == []


def test_what_was_measured_is_drawn_before_the_prediction_is_made(store, measured_run,
                                                                  monkeypatch):
    """A run's first prediction traces its step (seconds in a fresh server): the measured curve
    and the operation classes are on the page before it starts, so a prediction still under way
    (here: one that never returns, an error) leaves them drawn, each in its place."""
    def under_way(rep):
        raise RuntimeError("still tracing")

    monkeypatch.setattr(breakdown, "predicted", under_way)
    app = AppTest.from_file(APP, default_timeout=60)
    app.session_state[INTERACTIVE] = True
    app.run()
    app.query_params["run"] = str(measured_run)
    app.switch_page("screens/anatomy.py").run()
    assert "still tracing" in str(app.exception[0].message)
    assert chart_spec(app, "anatomy_first_steps")["layout"]["shapes"]  # the curve, its steps
    assert chart_spec(app, "anatomy_operations")["data"]
    headers = [h.value for h in app.subheader]
    assert headers.index("The first steps of training") < headers.index(
        "Where the time goes: operation classes")


def test_operation_classes_next_to_the_papers_and_the_top_operators(store, measured_run):
    app = _page(run=str(measured_run))
    chart = chart_spec(app, "anatomy_operations")
    names = {t["name"] for t in chart["data"]}
    assert names == {"this run", "Ivanov et al. (BERT, PyTorch)"}
    assert len(_table(app, "top_operators")) == 10
    words = " ".join(m.value for m in app.markdown)
    assert "fused attention kernel" in words and "90% of the time" in words
    assert any("Data Movement Is All You Need" in c.value for c in app.caption)


def test_a_run_without_components_or_profile_says_how_to_get_them(store, seed):
    run_id = seed()
    app = _page(run=str(run_id))
    infos = " ".join(i.value for i in app.info)
    assert "No measured components" in infos
    assert "Profile steps" in infos and "--profile-steps" in infos
    table = _table(app, "components").set_index("Component")
    assert table.loc["CUDA context", "Measured (MiB)"] == 1024  # the phases still tell it
    assert table.loc["weights", "Predicted (MiB)"] == pytest.approx(1278.5, abs=0.1)


def test_the_line_below_the_curve_leaves_room_for_its_words_above_the_time_axis(store, seed):
    """A CPU run's first steps: the process's line before training lay at the foot of the y
    range, and its words ("before training, beyond the weights: …") over the time axis's
    numbers."""
    run_id = seed(backend="cpu-rss")
    rep = report(store, run_id)
    expected = breakdown.CpuPeak(before_training=512 * MIB, tensors=3584 * MIB, over=0)
    chart = figures.first_steps_figure(rep, store.samples(run_id, rep.gpu), store.steps(run_id),
                                       expected=expected).to_plotly_json()
    low, high = chart["layout"]["yaxis"]["range"]
    assert high >= 4096  # the predicted peak, 512 + 3,584 MiB, and the curve's top
    # The words sit under the line at 512 MiB: a label's height (a row of 12 px text on a chart
    # 400 px high) between them and the range's foot
    assert (512 - low) / (high - low) > 0.1


def test_a_cpu_run_says_what_its_figures_are(store, seed):
    run_id = seed(backend="cpu-rss")
    prediction = breakdown.prediction_for(report(store, run_id))
    summary = store.run(run_id).summary
    store.update_run(run_id, summary={**summary.to_dict(), "components": {
        "weights": prediction.weights, "gradients": prediction.gradients,
        "optimizer_states": prediction.optimizer_states, "activations": prediction.activations}})
    app = _page(run=str(run_id))
    infos = " ".join(i.value for i in app.info)
    assert "A CPU run" in infos and "autograd saved" in infos and "RSS" in infos
    table = _table(app, "components").set_index("Component")
    assert "CUDA context" not in table.index
    assert table.loc["sum of the parts", "Error (%)"] == 0  # like with like: no temporary
    assert table.loc["peak (RSS, over the baseline)", "Measured (MiB)"] == 3072


def test_no_runs_yet():
    assert "No runs stored yet" in _page().info[0].value


# --- the logic, without Streamlit ---

def test_the_predicted_temporary_uses_the_measured_arithmetic(store, measured_run):
    rep = report(store, measured_run)
    prediction = breakdown.prediction_for(rep)
    predicted = prediction.as_components()
    # The peak is weights + states + the larger of activations and gradients + the rest.
    assert predicted.temporary == prediction.peak - (
        prediction.weights + prediction.optimizer_states + prediction.activations)
    rows = {r.component: r for r in view.component_rows(rep, prediction)}
    assert rows["temporary buffers"].measured == rep.components.temporary
    assert rows["sum of the parts"].predicted == predicted.sum_of()


def test_nvml_predicted_is_a_band_where_cudnns_workspaces_are_not_traced(store, measured_run):
    """A convolution network's NVML figure: the traced one, up to what cuDNN's workspaces may
    add (not traced, unless measured on the GPU)."""
    from dataclasses import replace

    rep = report(store, measured_run)
    prediction = breakdown.prediction_for(rep)
    note = {r.component: r.note for r in view.component_rows(rep, prediction)}
    assert "up to" not in note["peak (NVML, over the baseline)"]
    banded = replace(prediction, workspace_band=100 * 2**20)
    note = {r.component: r.note for r in view.component_rows(rep, banded)}
    assert note["peak (NVML, over the baseline)"].endswith(
        f"; up to {mib_text(banded.nvml_peak + 100 * 2**20)} with cuDNN's convolution "
        "workspaces (chosen as the run goes: not traced)")


def test_with_checkpointing_the_activations_are_what_the_peak_never_holds(store, seed):
    run_id = seed()
    store.update_run(run_id, options={**store.run(run_id).options,
                                      "gradient_checkpointing": True})
    rep = report(store, run_id)
    prediction = breakdown.prediction_for(rep)
    steps = dict((label, value) for label, _, value in view.waterfall(rep, prediction)[
        "predicted"])
    assert steps["never held at once"] == -prediction.activations
    assert "in the optimizer step" in view.peak_explanation(rep, prediction)


def test_what_the_operation_shares_mean_on_each_device():
    gpu = OperationProfile.from_dict(_profile("cuda"))
    assert "without tensor cores" in view.operations_explanation(gpu, "fp32")
    assert "without tensor cores" not in view.operations_explanation(gpu, "bf16")
    cpu = OperationProfile.from_dict({**_profile("cpu"), "device": "cpu"})
    assert view.operations_explanation(cpu, "fp32").startswith("On a CPU")


def test_the_waterfall_figure_keeps_one_order_for_both_sides(store, measured_run):
    rep = report(store, measured_run)
    figure = figures.anatomy_waterfall_figure(
        view.waterfall(rep, breakdown.prediction_for(rep)))
    order = list(figure.layout.xaxis.categoryarray)
    assert order[:3] == ["CUDA context", "weights", "gradients"]
    assert order.index("context + all parts") < order.index("never held at once") < order.index(
        "context + tensor peak") < order.index("peak (NVML)")
    assert figure.layout.waterfallmode == "group"


def test_a_run_that_is_not_stored_is_said(store, seed):
    run_id = seed()
    app = _page(run="99999")
    assert [w.value for w in app.warning] == [f"Run 99999 not found: showing run {run_id}."]
    assert app.query_params["run"] == str(run_id)


# --- a user's own training ---

def test_a_users_trainer_run_shows_measured_next_to_predicted(store, seed_users):
    """The page used to stop after the line saying what the prediction was made from: no chart,
    no table, no error, although the callback had measured the components."""
    run_id = seed_users("trainer")
    app = _page(run=str(run_id))
    assert not app.warning, [w.value for w in app.warning]
    assert "Measured next to predicted" in [h.value for h in app.subheader]
    assert any(c.value.startswith("Predicted from what the run recorded") for c in app.caption)
    table = _table(app, "components").set_index("Component")
    assert table.loc["weights", "Measured (MiB)"] == table.loc["weights", "Predicted (MiB)"]
    assert table.loc["activations", "Measured (MiB)"] == 30
    sides = {t["name"] for t in chart_spec(app, "anatomy_waterfall")["data"]}
    assert sides == {"measured", "predicted"}


@pytest.mark.parametrize("shape, why", [
    ("phase api", "the phase API"), ("command", "watched without anatomy's callback")])
def test_a_users_run_without_a_model_says_in_one_line_why_there_is_no_prediction(
        store, seed_users, shape, why):
    app = _page(run=str(seed_users(shape)))
    (warning,) = [w.value for w in app.warning]
    assert why in warning and "\n" not in warning
    assert "cannot be built on this machine" not in warning  # the model was never recorded


# --- the model a run carries ---

def test_a_users_run_of_a_quantized_model_says_its_prediction_is_unquantized(store, seed_users):
    """A QLoRA script's model (loaded with a BitsAndBytesConfig: its config keeps the
    quantization_config) is predicted unquantized beside what was measured: the page says so."""
    run_id = seed_users("trainer")
    kept = store.run(run_id).environment.model_config
    store.merge_environment(run_id, {"model_config": {**kept, "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}})
    app = _page(run=str(run_id))
    assert not app.exception
    basis = next(c.value for c in app.caption
                 if c.value.startswith("Predicted from what the run recorded"))
    assert basis.endswith(" The config's quantization_config (bitsandbytes, 4-bit) is left "
                          "out: the weights are unquantized."), basis


def test_a_run_of_a_relative_model_folder_since_deleted_is_predicted_from_the_config_it_kept(
        tmp_path, model_gone):
    """`anatomy run --model my-bert` in one folder, the dashboard started in another: "No
    prediction: model: 'my-bert' is not a preset …", and no measured-next-to-predicted at all."""
    run_id = model_gone()
    app = _page(run=str(run_id))
    assert not app.warning, [w.value for w in app.warning]
    assert "Measured next to predicted" in [h.value for h in app.subheader]
    table = _table(app, "components").set_index("Component")
    assert table.loc["weights", "Predicted (MiB)"] > 0
    folder = tmp_path / "project" / "my-bert"
    assert text.literal(f"Predicted from the config the run kept of its model, my-bert (model "
                        f"folder {folder}), whatever became of the file since.") in \
        [c.value for c in app.caption]


def test_a_run_stored_before_runs_kept_their_model_says_in_one_line_that_it_is_not_here(
        model_gone):
    run_id = model_gone(kept=False)
    app = _page(run=str(run_id))
    (warning,) = [w.value for w in app.warning]
    assert warning.startswith("No prediction: model: no such model folder: my-bert (the run "
                              "names its model as it was given where it started") and \
        "\n" not in warning


def test_a_run_that_never_had_a_full_micro_batch_says_so(store, seed):
    run_id = seed(backend="cpu-rss")  # batch size 4: its data held 3 samples
    prediction = breakdown.prediction_for(report(store, run_id))
    summary = store.run(run_id).summary
    store.update_run(run_id, summary={**summary.to_dict(), "components": {
        "weights": prediction.weights, "gradients": prediction.gradients,
        "optimizer_states": prediction.optimizer_states, "activations": prediction.activations,
        "micro_batch": 3}})
    app = _page(run=str(run_id))
    assert [w.value for w in app.warning] == [
        "This run never had a full micro-batch of 4 samples (its data held fewer): its "
        "activations were measured on a micro-batch of 3, and the prediction is for 4."]


# --- a run on a dataset: the batch it measured, and what its data can reach ---

DATA = {"dataset": "/elsewhere/reviews", "split": "train", "text_column": "text",
        "tokenizer": "/elsewhere/tok", "padding": "longest", "max_length": 512,
        "inputs": ["attention_mask"], "padding_side": "right",
        "lengths": [[4, 2], [12, 1], [20, 2]]}


@pytest.fixture
def dataset_run(store, seed):
    """A CPU run of tiny-llama on five texts (4, 4, 12, 20 and 20 tokens), batches of two padded
    to their longest: its components measured on a micro-batch of 12 and 4 tokens."""
    from anatomy.analysis.lengths import TextBatch
    from anatomy.analysis.options import RunOptions
    from anatomy.prediction import predict

    run_id = seed(backend="cpu-rss")
    options = RunOptions(model="tiny-llama", batch_size=2, max_steps=8, dataset_size=5,
                         dataset=DATA["dataset"], tokenizer=DATA["tokenizer"])
    store.update_run(run_id, options=options.to_dict())
    store.merge_environment(run_id, {"data": DATA})
    measured = predict(options, device="cpu", text=TextBatch((12, 4), 12))
    summary = store.run(run_id).summary
    store.update_run(run_id, summary={**summary.to_dict(), "components": {
        "weights": measured.weights, "gradients": measured.gradients,
        "optimizer_states": measured.optimizer_states, "activations": measured.activations,
        "micro_batch": 2, "padded_to": 12, "sequence_lengths": [12, 4]}})
    return run_id


def test_a_dataset_run_is_measured_next_to_predicted_at_the_batch_it_measured(store, dataset_run):
    """The measured components are a 2 × 12 batch's, the shuffle's, not the longest: the table
    holds them against that batch's prediction, and what the data can reach (its longest batch,
    2 × 20) is said apart, beside the peak sampled over every step."""
    rep = report(store, dataset_run)
    assert view.measured_batch_line(rep).startswith(
        "Measured and predicted at the micro-batch the activations were measured on: 2 × 12 "
        "tokens, its texts 4 to 12 tokens long.")
    rows = {r.component: r for r in view.component_rows(rep, breakdown.predicted(rep))}
    assert rows["activations"].error_percent == 0 and rows["activations"].measured > 0
    # the RSS peak was sampled over every step's batch: not this batch's to be held against
    rss = rows["peak (RSS, over the baseline)"]
    assert rss.measured is not None and rss.predicted is None and "every step" in rss.note
    reach = breakdown.data_reach(rep)
    assert reach.longest.padded_to == 20 and reach.prediction.activations > \
        rows["activations"].measured
    line = view.reach_line(rep, reach)
    assert line.startswith("What the data can reach: its longest batch, 2 × 20 tokens, its texts "
                           "12 to 20 tokens long, is predicted to peak at ")
    assert line.endswith(f"The run's sampled peak over all its 8 steps: "
                         f"{mib_text(breakdown.measured_peak(rep))} (RSS, over the "
                         "baseline).")
    app = _page(run=str(dataset_run))
    assert not app.exception
    assert view.measured_batch_line(rep) in [c.value for c in app.caption]
    assert line in [i.value for i in app.info]


def test_a_dataset_run_stored_before_the_probe_said_its_batch_is_predicted_at_its_longest(
        store, dataset_run):
    summary = store.run(dataset_run).summary.to_dict()
    parts = {k: v for k, v in summary["components"].items()
             if k not in ("padded_to", "sequence_lengths")}
    store.update_run(dataset_run, summary={**summary, "components": parts})
    rep = report(store, dataset_run)
    assert view.measured_batch_line(rep) is None and breakdown.data_reach(rep) is None
    longest = breakdown.predicted(rep)
    assert longest.activations > parts["activations"]  # today's reading, kept


def test_the_first_steps_notes_keep_clear_of_the_curve_the_lines_and_each_other(store, seed):
    """A CPU run whose curve lies far above the prediction's lines: the notes' heights were
    shares of the curve's own span, flat here, and both notes lay on the curve, one over the
    other (seen in Chromium: "after step 1 …" hidden under "from step 2 on …")."""
    run_id = seed(backend="cpu-rss")  # the training's plateau: 4,096 MiB
    rep = report(store, run_id)
    samples, steps = store.samples(run_id, rep.gpu), store.steps(run_id)
    expected = breakdown.CpuPeak(before_training=512 * MIB, tensors=512 * MIB, over=0)
    repeated = view.repetition(rep, samples, steps)
    chart = figures.first_steps_figure(rep, samples, steps, expected=expected,
                                       repeated=repeated).to_plotly_json()
    low, high = chart["layout"]["yaxis"]["range"]
    box = figures.NOTE_SHARE * (high - low)  # a note's height on the axis
    notes = [a["ay"] for a in chart["layout"]["annotations"] if a.get("showarrow")]
    assert len(notes) == 2 and abs(notes[0] - notes[1]) >= box
    curve = [s.used / MIB for s in samples if chart["layout"]["xaxis"]["range"][0] <= s.t]
    for at in notes:
        assert low + box / 2 <= at <= high - box / 2  # inside the plot
        assert at + box / 2 < min(curve) or at - box / 2 > max(curve)  # not on the curve
        # nor on the lines' words: under the line at 512 MiB, over the one at 1,024 MiB
        assert not (512 - box <= at + box / 2 and at - box / 2 <= 512)
        assert not (1024 <= at + box / 2 and at - box / 2 <= 1024 + box)


def test_a_dataset_runs_page_says_what_it_trained_on_and_that_its_path_holds_other_data_now(
        store, dataset_run):
    """The page named neither the data a run trained on nor that its path no longer holds it
    (`anatomy show` said both): both under the run's title, the change as a warning."""
    store.merge_environment(dataset_run, {"data": {
        **DATA, "fingerprint": "0123456789abcdef", "file_bytes": 531, "modified": 1.7e9}})
    rep = report(store, dataset_run)
    app = _page(run=str(dataset_run))
    assert not app.exception
    captions = [c.value for c in app.caption]
    assert text.literal(text.data_line(rep.environment.data)) in captions
    assert text.literal("data gone: no data is at /elsewhere/reviews now: the lengths above are "
                        "the run's own, kept in the store") in [w.value for w in app.warning]


def test_a_run_on_the_dummy_data_says_nothing_of_data(store, measured_run):
    app = _page(run=str(measured_run))
    assert not [c.value for c in app.caption if c.value.startswith("data")]
    assert not [w.value for w in app.warning if w.value.startswith("data")]


def test_a_dataset_runs_waterfall_ends_its_predicted_side_where_the_table_does(store, dataset_run):
    """The table gives the peak sampled over every step no prediction ("—": other batches than
    the one predicted), yet the waterfall's predicted side went on to a predicted RSS peak
    (303 MiB), and the caption said both end on the table's last row."""
    rep = report(store, dataset_run)
    prediction = breakdown.predicted(rep)
    rows = view.component_rows(rep, prediction)
    assert rows[-1].predicted is None
    last_predicted = [r for r in rows if r.predicted is not None][-1]
    sides = view.waterfall(rep, prediction)
    climbed = sum(s.bytes for s in sides["predicted"] if s.measure == "relative")
    assert climbed == last_predicted.predicted == prediction.peak
    assert sides["measured"][-1].label == rows[-1].component  # the measured side: to the RSS peak
    app = _page(run=str(dataset_run))
    caption = next(c.value for c in app.caption if c.value.startswith("Each part adds"))
    assert "Both end on the figures of the table's last row" not in caption
    assert "On a dataset the predicted side ends at the tensor peak" in caption
