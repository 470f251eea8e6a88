"""Anatomy: what one run's training memory is made of, measured next to predicted, and where its
time goes by operation class."""

from __future__ import annotations

import streamlit as st

from anatomy.analysis.data import data_change
from anatomy.analysis.operations import PAPER_CITATION, comparison
from anatomy.analysis.report import RunReport, report
from anatomy.dashboard import links, server, widgets
from anatomy.prediction import WALKTHROUGH_BYTES_PER_PARAMETER, breakdown
from anatomy.units import MIB_NAME, in_mib, mib_float
from anatomy.views import anatomy as view
from anatomy.views import gpus as gpus_view
from anatomy.views import text
from anatomy.views.figures import anatomy as figures
from anatomy.vocabulary import Status


def measured_and_predicted(rep: RunReport, prediction) -> None:
    st.subheader("Measured next to predicted")
    if batch := view.measured_batch_line(rep):
        st.caption(batch)
    if evaluated := view.evaluation_line(rep):
        st.caption(evaluated)
    widgets.chart(figures.anatomy_waterfall_figure(view.waterfall(rep, prediction)),
                  "anatomy_waterfall")
    # A dataset's run: its peaks were sampled over every step's batch, not the one predicted;
    # the predicted side ends at the tensor peak, as the table's predictions do.
    apart = ("" if text.measured_text_batch(rep) is None else
             " On a dataset the predicted side ends at the tensor peak, where the table's "
             "predictions end: the peak sampled over every step held other batches than the one "
             "predicted here (what the data can reach, below, holds it against the longest).")
    if rep.on_gpu:
        st.caption("Each part adds to the one before; *all parts* is their sum, which no moment "
                   "of a step reaches; *never held at once* takes away what is freed before the "
                   "rest arrives (the smaller of activations and gradients), leaving the **tensor "
                   "peak**. The predicted peak is that tensor "
                   "peak (compare it with the allocator's measured peak); NVML's peak adds the "
                   "CUDA context, the allocator's cache and memory outside PyTorch, predicted "
                   "from the caching allocator's simulation and the GPU's calibrated constants."
                   + apart)
    elif apart:
        st.caption("Each part adds to the one before; *all at once* is their sum. On a CPU there "
                   "is no allocator to read a tensor peak from: the measured side goes on to the "
                   "peak RSS, the last row of the table." + apart)
    else:
        st.caption("Each part adds to the one before; *all at once* is their sum. On a CPU there "
                   "is no allocator to read a tensor peak from: the measured side goes on to the "
                   "peak RSS; the predicted side adds, to the tensors' predicted peak, what the "
                   "process held before training beyond its weights (the interpreter, torch's "
                   "libraries: measured, never predicted). Both end on the figures of the "
                   "table's last row.")
    rows = view.component_rows(rep, prediction)
    # Its notes wrap: in a dataframe the Note column was cut at a laptop's width.
    widgets.wrapped_table([{"Component": r.component, in_mib("Measured"): mib_float(r.measured),
                            in_mib("Predicted"): mib_float(r.predicted),
                            "Error (%)": r.error_percent, "Note": r.note} for r in rows],
                          {in_mib("Measured"): "{:,.1f}", in_mib("Predicted"): "{:,.1f}",
                           "Error (%)": "{:+.2f}%"})
    st.caption(f"Error = (predicted − measured) / measured. {MIB_NAME} = 2²⁰ bytes. The notes in full: "
               + view.NOTES[rep.on_gpu] + " docs/PREDICTION.md states every formula of the "
               "prediction and where it comes from.")


def data_reach(rep: RunReport) -> None:
    """A run on a dataset: the peak its longest batch is predicted to reach, beside the peak
    sampled over every step (the table above is the measured batch's)."""
    if view.measured_batch_line(rep) is None:
        return
    underway = st.empty()
    underway.info("Predicting the data's longest batch…", icon=":material/hourglass_top:")
    reach = breakdown.data_reach(rep)
    underway.empty()
    if reach is not None:
        st.info(view.reach_line(rep, reach), icon=":material/dataset:")


def peak_section(rep: RunReport, prediction) -> None:
    st.subheader(view.peak_title(rep, prediction))
    st.markdown(view.peak_explanation(rep, prediction))
    rows = view.moment_rows(rep, prediction)
    widgets.chart(figures.moments_figure(rows, view.predicted_sum_of_parts(rep, prediction)),
                  "anatomy_moments")
    measured = any(r.measured is not None for r in rows)
    st.caption("Tensor memory at each moment of a step after the first (the optimizer states "
               "exist then). " + ("Measured: the allocator at the end of the forward pass, at the "
                                  "end of the backward pass (before the optimizer step) and after "
                                  "the optimizer step, its temporaries freed. *During* the step "
                                  "only the prediction has a figure: it adds the step's "
                                  "temporaries, which is why it is higher than *after* it."
                                  if measured else "Measured moments come from the allocator: "
                                  "GPU runs with measured components only."))


def bytes_per_parameter(rep: RunReport, prediction) -> None:
    st.subheader("Bytes per parameter")
    count = breakdown.parameters(rep, prediction)
    rows = view.bytes_per_parameter_rows(rep, prediction)
    widgets.table([{"Component": r.component, "This run (measured)": r.measured,
                   "Predicted": r.predicted, "The walkthrough": r.walkthrough}
                  for r in rows], hide_index=True, key="anatomy_bytes_per_parameter",
                 column_config={k: st.column_config.NumberColumn(format="%.2f")
                                for k in ("This run (measured)", "Predicted", "The walkthrough")})
    st.caption(f"{count:,} parameters. The walkthrough's figures: " + "; ".join(
        f"{name}: {value:g}" for name, value in WALKTHROUGH_BYTES_PER_PARAMETER.items())
        + ". Under fp16/bf16 the Trainer keeps the weights in fp32 and autocast makes the 16-bit"
          " copies in each forward pass, so they show up in the activations, not the weights.")


def first_steps(rep: RunReport, samples, steps, expected: breakdown.CpuPeak | None,
                key: str) -> None:
    st.subheader("The first steps of training")
    if rep.training is None:
        st.info(view.no_training(rep))
        return
    repeated = view.repetition(rep, samples, steps)
    widgets.chart(figures.first_steps_figure(rep, samples, steps, expected=expected,
                                             repeated=repeated), key)
    if expected is not None:
        st.caption("On the curve's own axis, the CPU prediction: the dotted line is what the "
                   "process held before training beyond its weights (the interpreter, torch's "
                   "libraries, the data: measured, no prediction covers it); the dashed line "
                   "adds the tensors' predicted peak to it.")
    st.caption(view.first_steps_caption(rep, repeated))


def operations(rep: RunReport) -> None:
    st.subheader("Where the time goes: operation classes")
    if not rep.operations:
        st.info(view.not_profiled(rep))
        return
    profile = rep.operations
    widgets.chart(figures.operations_figure(comparison(profile)), "anatomy_operations")
    st.markdown(view.operations_explanation(profile, rep.options.precision))
    st.caption(f"{profile.steps} profiled steps, forward and backward passes; time is "
               f"{profile.time_source}. Optimizer step (clipping and optimizer.step(), kept "
               f"apart): {profile.optimizer.time_us / 1000 / max(1, profile.steps):,.1f} ms a "
               f"step. Paper: {PAPER_CITATION}")
    st.markdown("**Top operators by time**")
    widgets.table([{"Operator": o["name"], "Class": o["class"], "Time (ms)": o["time_us"] / 1000,
                   "GFLOP": o["flops"] / 1e9, "Calls": o["count"]} for o in profile.top(10)],
                 hide_index=True, key="anatomy_top_operators",
                 column_config={"Time (ms)": st.column_config.NumberColumn(format="%.2f"),
                                "GFLOP": st.column_config.NumberColumn(format="%.3f")})


def per_gpu(rep: RunReport) -> None:
    """Several processes: each GPU measured next to its rank's prediction."""
    st.subheader(f"Per {'GPU' if rep.on_gpu else 'process'}: {rep.processes}")
    if (silent := text.unrecorded_ranks(rep)) is not None:
        st.caption(text.literal(silent))
    underway = st.empty()  # not st.spinner: see main()
    underway.info("Predicting each rank…", icon=":material/hourglass_top:")
    predicted = breakdown.rank_prediction_for(rep)
    underway.empty()
    if predicted is not None:
        st.caption(predicted.line())
    spread = gpus_view.spread_line(rep)
    if spread:
        st.markdown(spread)
    for line in gpus_view.standouts(rep):
        st.warning(line, icon=":material/warning:")
    rows = [row._asdict() for row in view.rank_rows(rep, predicted)]
    where = "GPU" if rep.on_gpu else "process"  # each row's rank, as the run trained it
    widgets.table([{where: row.pop("gpu"), **row} for row in rows], hide_index=True,
                  key="anatomy_per_gpu")


def main() -> None:
    st.title("Anatomy")
    st.caption("Where one run's training memory goes, component by component, measured next to "
               "what the model config and the options predict; and where its time goes.")
    db = server.store()
    runs = db.runs()
    if not runs:
        st.info("No runs stored yet: start one on the Live run page, or with "
                "`python -m anatomy run`.")
        return
    ids = [run.id for run in runs]
    labels = {run.id: text.run_choice(run) for run in runs}
    links.choose_run_from_url(ids, "anatomy_run")
    run_id = st.selectbox("Run", ids, format_func=labels.get, key="anatomy_run",
                          on_change=links.run_to_url, args=("anatomy_run",))
    rep = report(db, run_id)
    st.subheader(text.literal(rep.title()))
    data = rep.environment.data
    if data is not None:  # what it trained on, and whether that path still holds it (as `show`)
        st.caption(text.literal(text.data_line(data)))
        if (change := data_change(rep.environment)) is not None:
            st.warning(text.literal(text.data_change_line(change)), icon=":material/warning:")
    if not rep.on_gpu:
        st.info("A CPU run: there is no CUDA context and no caching allocator. Activations are "
                "measured from the tensors autograd saved for the backward pass, and the peak is "
                "the RSS of the training process, which includes torch's libraries and Python.")
    if rep.status == Status.RUNNING:
        st.info("In progress: the measured components are stored when the run ends. Until then, "
                "the prediction alone.")
    elif rep.components is None:
        st.info(view.no_components(rep))
    elif partial := text.partial_micro_batch_words(rep):
        st.warning(partial)
    # What was measured is drawn before the prediction is made: a run's first prediction traces
    # its training step (seconds in a fresh server: torch and transformers imported, then the
    # trace; docs/BENCHMARKS.md), and the measured curve needs none of it. The sections keep
    # their order on the page: each is written into its own place.
    # Read once: a CPU run's curve is drawn twice (without, then with its prediction).
    steps = db.steps(rep.id)
    samples = db.samples(rep.id, rep.gpu) if rep.training is not None else []
    predicted_sections, ranks, curve = st.container(), st.container(), st.empty()
    with curve.container():  # a GPU run's curve is final: a CPU run's has its prediction drawn
        first_steps(rep, samples, steps, None,
                    "anatomy_first_steps" if rep.on_gpu else "measured_first_steps")
    operations(rep)
    with predicted_sections:
        # A note of its own, not st.spinner: the spinner is a transient element, and one in a
        # container written after the elements below it is drawn empty (seen in Chromium).
        underway = st.empty()
        underway.info("Predicting: the run's training step traced on fake tensors (seconds, "
                      "the first time a run is opened)…", icon=":material/hourglass_top:")
        prediction = breakdown.predicted(rep)
        underway.empty()
        if isinstance(prediction, breakdown.NoPrediction):
            st.warning(f"No prediction: {text.literal(prediction.reason)}.")
        else:
            if not rep.started_by_anatomy:
                st.caption(view.user_run_basis(rep, steps))
            elif basis := view.kept_model_basis(rep):
                st.caption(text.literal(basis))
            measured_and_predicted(rep, prediction)
            data_reach(rep)
            peak_section(rep, prediction)
            bytes_per_parameter(rep, prediction)
    if rep.world_size > 1:
        with ranks:
            per_gpu(rep)
    if not rep.on_gpu:  # on its own axis, what the process holds by the prediction
        expected = (None if isinstance(prediction, breakdown.NoPrediction) else
                    breakdown.cpu_peak(rep, prediction))
        with curve.container():
            first_steps(rep, samples, steps, expected, "anatomy_first_steps")

main()
