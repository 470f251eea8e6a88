"""What several pages draw alike: the sidebar's device, a run's charts (memory, loss and step
time, the device panel), how a run ended, one run option's widget, and Stop."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from anatomy.analysis.options import FIELDS, Kind, RunOptions, defaults_for
from anatomy.analysis.report import RunReport
from anatomy.dashboard import server
from anatomy.units import MIB_NAME, gib_text, in_mib, mib_float
from anatomy.views import gpus as gpus_view
from anatomy.views import live as live_view
from anatomy.views import text
from anatomy.views.figures import gpus as gpu_figures
from anatomy.views.figures import live as live_figures
from anatomy.views.figures import svg
from anatomy.vocabulary import Phase, Status, phase_name


def sidebar_device() -> None:
    info = server.device()
    with st.sidebar:
        st.subheader("Device")
        if info.has_gpu:
            for gpu in info.devices:
                st.markdown(f"**GPU {gpu.index}: {gpu.name}**  \n"
                            f"{gib_text(gpu.total)} total")
            st.caption(f"driver {info.driver} · CUDA {info.cuda_driver} · "
                       f"NVML memory API {info.memory_api}")
        else:
            why = info.why_no_gpu or "no GPU here"
            st.markdown(f"**{why[0].upper()}{why[1:]}: measuring the CPU's RAM (RSS)**")
            st.caption(f"{gib_text(info.ram_total)} RAM",
                       help=f"{info.nvml_error}" if info.nvml_error else None)
        st.caption("Measures " + text.source(info.backend, info.memory_api))


# The memory chart's x axes (views/figures/live.py AXES), as the segmented control names them.
AXIS_NAMES = {"run": "Whole run (s)", Phase.TRAINING: "Training (s)", "step": "Training steps"}
CHART = {"displaylogo": False}
# Streamlit's defaults, fitted to a narrow window: a metric's value shrinks with the window
# instead of being cut ("541…"), and a long button label never wraps into an ellipsis.
STYLE = """<style>
[data-testid="stMetricValue"] > div { font-size: clamp(1.25rem, 2.4vw, 2.25rem); }
/* Room for the charts: a 1,000 px window's column was 540 px between 80 px margins, and at
   1280 x 800 the Live chart began below the window's edge. */
[data-testid="stMainBlockContainer"] { padding: 1.5rem 2rem 4rem; }
[data-testid="stMainBlockContainer"] h1 { padding: 0.25rem 0 0.5rem; }
.st-key-delete_yes button { background-color: #B3261E; border-color: #B3261E; color: white; }
.st-key-delete_yes button:hover { background-color: #8C1D18; border-color: #8C1D18;
                                  color: white; }
/* The element that carries this style takes no room (nor the gap under it). */
[data-testid="stElementContainer"]:has(style) { display: none; }
</style>"""


def style() -> None:
    # In the page's flow, ahead of every element the page draws: st.html sends a style alone to
    # Streamlit's event container, which a browser may show after the charts, so a chart was first
    # laid out between the 80 px margins (540 px at 1,000 px) and then moved.
    st.markdown(STYLE, unsafe_allow_html=True)


MISSING = "—"  # what a table shows where a run has no value (Streamlit's own word is "None")
# A text column as wide as its longest text (Streamlit's own sizing reads a few rows, and cut
# "2 × CPU (ddp)"): the table's font, 14 px, is about 7.5 px a character.
CHAR_PX, PADDING_PX, WIDEST_PX = 7.5, 28, 640


# What a table shows side by side without scrolling in a 1,000 px window: the main column's
# 636 px (STYLE's margins) less the row selection's boxes (33 px) and a margin for the widths'
# estimate.
TABLE_PX = 580


def table(data, column_config: dict | None = None, fit: Sequence[str] | None = None,
          widest: dict[str, int] | None = None, always: Sequence[str] = (), **kwargs):
    """st.dataframe, a missing value shown as MISSING, each text column wide enough for its
    texts (a column configured with a width keeps it), and no wider than `widest` says for it.
    `fit`: the headings in the order they earn a place; those that fit TABLE_PX side by side are
    shown, the others hidden, a click away in the table's toolbar (Show/hide columns). `always`:
    headings shown whatever room they take (what a row is read for), counted first."""
    config = dict(column_config or {})
    for name, width in _text_widths(data, widest).items():
        if config.get(name) is None:
            config[name] = st.column_config.Column(width=width)
    if fit is not None:
        widths = _widths(data, widest)
        used = sum(widths[name] for name in always)
        for name in fit:
            if name in always:
                continue
            used += widths[name]
            if used > TABLE_PX:
                config[name] = {**(config.get(name) or {}), "hidden": True}
    return st.dataframe(data, placeholder=MISSING, column_config=config, **kwargs)


def wrapped_table(rows: list[dict], formats: dict[str, str]) -> None:
    """A small table whose long texts wrap instead of being cut (a dataframe's cells hold one
    line, and a column beyond the page's width is scrolled to, its text cut at the edge): each
    number in its column's format ("{:.1f}"), a missing value shown as MISSING."""
    frame = pd.DataFrame(rows)
    st.table(frame.style.format(na_rep=MISSING).format(formats, na_rep=MISSING)
             .hide(axis="index"))


def _columns(data) -> dict[str, list]:
    styled = getattr(data, "data", None)  # a pandas Styler's frame
    frame = styled if isinstance(styled, pd.DataFrame) else pd.DataFrame(data)
    columns = {str(name): list(frame[name]) for name in frame.columns}
    if not isinstance(frame.index, pd.RangeIndex):  # a table set_index'ed: its row names
        columns["_index"] = [*frame.index, frame.index.name or ""]
    return columns


def _width(name: str, texts: list[str]) -> int:
    longest = max(len(text) for text in [*texts, "" if name == "_index" else name])
    return min(WIDEST_PX, round(PADDING_PX + CHAR_PX * longest))


def _text_widths(data, widest: dict[str, int] | None = None) -> dict[str, int]:
    widths = {}
    for name, values in _columns(data).items():
        texts = [v for v in values if isinstance(v, str)]
        if texts:
            widths[name] = min(_width(name, texts), (widest or {}).get(name, WIDEST_PX))
    return widths


def _widths(data, widest: dict[str, int] | None = None) -> dict[str, int]:
    """Every column's width as drawn, estimated from its heading and its values as shown (no
    wider than `widest` says for it)."""
    return {name: min(_width(name, [MISSING if v is None else f"{v:,.2f}" if isinstance(v, float)
                                    else str(v) for v in values]),
                      (widest or {}).get(name, WIDEST_PX))
            for name, values in _columns(data).items()}


def axis_choice(key: str) -> str:
    """The memory chart's x axis: the whole run, its training phase, or its training steps."""
    chosen = st.segmented_control("Memory against", list(AXIS_NAMES), format_func=AXIS_NAMES.get,
                                  default="run", key=key, required=True,
                                  help="training steps: the training phase against its optimizer "
                                       "steps; the same x axis as the loss and step-time charts")
    return chosen or "run"


LIVE_REFRESH_SECONDS = 1.0  # how often the Live page redraws a run in progress
# A run's charts, one at a time: each chart a live page draws is redrawn every second, by the
# server and by the browser (hidden tabs are drawn too), and a busy machine answers Stop later.
VIEWS = {"memory": "Memory", "gpus": "Per GPU", "steps": "Loss and step time",
         "device": "Device"}


INTERACTIVE = "interactive_charts"  # the sidebar's switch, the same on every page of a tab


def chart_switch() -> None:
    """The sidebar's switch between pictures and interactive charts, for the whole tab: a new
    tab draws pictures (its first chart without Plotly's 4.7 MB of script, docs/BENCHMARKS.md)."""
    with st.sidebar:
        st.toggle("Interactive charts", key=INTERACTIVE,
                  help="hover, zoom and the legend's clicks on every chart; off, the charts are "
                       "pictures of the same figures, lighter for the browser (a new tab shows "
                       "its first chart sooner)")


def chart(figure, key: str) -> bool:
    """The figure as a picture (views/figures/svg.py) or, once the sidebar's switch asks for it
    or for a figure the picture cannot draw, as the interactive chart. True: a picture."""
    if not st.session_state.get(INTERACTIVE):
        try:
            drawn = svg.picture(figure)
        except svg.Unsupported:
            pass
        else:
            # Inline, not st.html (which keeps HTML's tags alone) nor st.image (text the tests
            # and the page's search could not read).
            st.markdown(drawn, unsafe_allow_html=True)
            return True
    st.plotly_chart(figure, key=key, config=CHART)
    return False


def run_charts(rep: RunReport, key: str, now: float | None = None, live: bool = False) -> None:
    """The run's memory, each of its GPUs (a run of several), its loss and step time, or its
    device panel, as chosen."""
    views = [v for v in VIEWS if v != "gpus" or rep.world_size > 1]
    names = VIEWS if rep.on_gpu else {**VIEWS, "gpus": "Per process"}  # CPU ranks: no GPU
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        # Unlabelled: its choices say what they are, and the chart starts a line higher.
        view = st.segmented_control("Show", views, format_func=names.get, default="memory",
                                    required=True, key=f"{key}_view",
                                    label_visibility="collapsed") or "memory"
        axis = axis_choice(f"{key}_axis") if view == "memory" else "run"
    if view == "memory":
        memory_chart(rep, now, axis, live)
    elif view == "gpus":
        per_gpu(rep, now)
    elif view == "steps":
        steps_chart(rep)
    else:
        device_panel(rep, live=live)


def memory_chart(rep: RunReport, now: float | None = None, axis: str = "run",
                 live: bool = False) -> None:
    """The run's memory: a picture of the figure or the interactive chart (`chart`), redrawn
    with each refresh of a live page. The small multiples of many GPUs stay interactive: the
    picture draws one pair of axes."""
    db = server.store()
    samples = db.decimated(rep.id, gpu_figures.buckets(rep))
    if not samples:  # an empty pair of axes says nothing: the words say why
        st.info(text.no_samples(rep))
        return
    figure = gpu_figures.memory_chart(rep, samples, db.steps(rep.id), now, axis)
    picture = chart(figure, f"memory-{rep.id}")
    st.caption(((f"A picture, redrawn every {LIVE_REFRESH_SECONDS:g} s while the run trains"
                 if live else "A picture") + ": hover and zoom with “Interactive charts” in the "
                "sidebar. " if picture else "") +
               "Shows " + text.source(rep.backend, rep.memory_api) +
               (f". {rep.world_size} GPUs: a panel per host, rank 0's phase bands in each"
                if gpu_figures.many(rep) else
                ". A band runs from the end of the phase before to the end of its own phase; its"
                " marker is the memory at that end, the walkthrough's figure.")
               + (" The grey band is torch.profiler's steps after training: the run's peak "
                  "leaves them out." if rep.profiling is not None else ""))


def per_gpu(rep: RunReport, now: float | None = None) -> None:
    """A run of several processes, GPU by GPU: the heat strip, the spread of the peaks and the
    GPUs that stand out, a row per GPU."""
    db = server.store()
    rows = gpus_view.gpu_rows(db, rep)
    spread = gpus_view.spread_line(rep)
    if spread:
        st.markdown(spread)
    for line in gpus_view.standouts(rep):
        st.warning(line, icon=":material/warning:")
    chart(gpu_figures.heat_strip(rep, db.decimated(rep.id, gpu_figures.buckets(rep)), now),
          f"gpus-{rep.id}")
    st.caption("A row per GPU, time across: the colour is the GPU's highest reading in each "
               "stretch of time, as a fraction of its memory. A row unlike the others is a GPU "
               "that fills first or starts late." if rep.on_gpu else
               "A row per process, time across: the colour is the highest RSS of "
               + ("the rank's own processes" if all(r.measured_alone for r in rep.ranks) else
                  "its host's processes, every rank's together")
               + f" in each stretch of time, in {MIB_NAME}. A row unlike the others is a process that "
               "fills first or starts late.")
    # A CPU rank's label is its rank ("rank 1"): no column repeats it.
    table([{"GPU" if rep.on_gpu else "process": r.gpu, **({"rank": r.rank} if rep.on_gpu else {}),
            in_mib("peak"): r.peak_mb,
            **{in_mib(phase_name(name, rep.on_gpu)): mb for name, mb in r.phase_mb.items()},
                   "training began (s)": r.training_start_s,
                   "samples/s (this rank's, after the first steps)": r.samples_per_second}
                  for r in rows], hide_index=True, key=f"gpu-table-{rep.id}",
                 column_config={"training began (s)": st.column_config.NumberColumn(
                     format="%.2f"), "samples/s (this rank's, after the first steps)":
                     st.column_config.NumberColumn(format="%.1f")})


def steps_chart(rep: RunReport) -> None:
    """Loss and time a step against the training steps (nothing before the first step)."""
    steps = server.store().steps(rep.id)
    if not steps:
        st.info(text.no_steps(rep))
        return
    chart(live_figures.steps_figure(rep, steps), f"steps-{rep.id}")
    st.caption(text.steps_caption(rep, steps))


def device_panel(rep: RunReport, live: bool) -> None:
    """What nvitop shows, from the readings the run's sampler stored a few times a second: each
    GPU's utilisation, power and temperature, the host's CPU and RAM, and every process on the
    GPUs (not only this run's). Live: the latest reading, the last minute as sparklines; a
    finished run: those figures over the whole run, and the processes at the end of training."""
    panel = live_view.device_panel(server.store(), rep, window_s=60.0 if live else None)
    if panel is None:
        st.caption("No device readings stored for this run (recorded before the device panel "
                   "existed, or imported).")
        return
    if live:
        for line in panel.gpus:
            _metrics(f"{line.name} · {rep.device_name}", line.metrics)
        for host in panel.host:
            _metrics(host.name, host.metrics)
    else:
        chart(live_figures.device_figure(panel.hosts, panel.gpu_readings, panel.host_names),
              f"device_history_{rep.id}")
    if panel.processes:
        st.markdown("**Processes on the GPU" + ("" if live else ", at the end of training")
                    + "**")
        table([{**({"Host": p.host} if p.host else {}), "GPU": p.gpu, "PID": p.pid,
                "Process": p.name or "(not visible here)",
                in_mib("GPU memory"): mib_float(p.used),
                "Run": "this run" if p.ours else ""} for p in panel.processes],
              hide_index=True, key=f"device_processes_{rep.id}",
              column_config={in_mib("GPU memory"): st.column_config.NumberColumn(format="%.0f")})
    st.caption(panel.caption)


def _metrics(title: str, metrics: list[live_view.PanelMetric]) -> None:
    st.markdown(f"**{title}**")
    with st.container(horizontal=True):
        for metric in metrics:
            st.metric(metric.label, metric.value, border=True, width=170,
                      chart_data=metric.history, chart_type="area")


def request_stop(run_id: int) -> None:
    """Stop's callback: the stop runs on a thread of its own (SIGTERM, the grace period, the
    collector's last rows take seconds), so the page says "stopping" at once."""
    st.session_state["stopping"] = run_id
    threading.Thread(target=server.manager().stop, args=(run_id,), name=f"anatomy-stop-{run_id}",
                     daemon=True).start()


def stopping(run_id: int) -> bool:
    return st.session_state.get("stopping") == run_id or server.manager().stopping(run_id)


def outcome(rep: RunReport, with_summary: bool = True) -> None:
    """How a finished run ended, and (`with_summary`) its summary as the walkthrough prints it."""
    line = live_view.status_line(rep)
    if rep.status == Status.COMPLETED:
        st.success(line)
    elif rep.status == Status.STOPPED:
        st.warning(line)
    else:
        st.error(line)
        if rep.error:
            # Wrapped: a one-line error longer than the page was cut at its right edge.
            st.code(rep.error, language=None, wrap_lines=True)
    if with_summary:
        summary(rep)


def summary(rep: RunReport) -> None:
    """A finished run's summary as the walkthrough prints it, and what the run said."""
    lines = live_view.summary_lines(rep)
    if lines:
        st.code("\n".join(lines), language=None)
    for message in rep.messages:
        st.caption(f"{message.level}: {text.literal(message.text)}")


def offered(name: str, model: str | None) -> bool:
    """Whether a form offers the run option `name` on this machine: the GPU index with a GPU,
    GPUs and strategy with two GPUs or more, CPU processes and strategy without a GPU;
    checkpointing where `model` can do it."""
    info = server.device()
    if name == "gradient_checkpointing":
        return live_view.offers_checkpointing(model)
    if name == "target_len":
        return live_view.offers_target_length(model)
    if name == "attention":
        return live_view.offers_attention(model)
    return {"gpu": info.has_gpu, "gpus": info.gpu_count > 1, "processes": not info.has_gpu,
            "strategy": info.gpu_count > 1 or not info.has_gpu}.get(name, True)


# The Live form's options as last sent, kept for the other forms of the tab (the Sweep's base):
# a widget's own state goes once its page is left.
LIVE_OPTIONS = "live_options"
OPTION_KEY = "option_"  # the Live form's widgets' keys: this, then the option's name


def option_key(name: str) -> str:
    return f"{OPTION_KEY}{name}"


def keep_form() -> None:
    """The Live form's values kept while another page shows. Streamlit drops a widget's state
    once a run of the script leaves the widget out: back on the Live page the form held its
    defaults again, under a forecast of the values gone (Start would have trained `tiny`). Set
    again at each run, the values are no widget's until the form draws its widgets with them."""
    for key in [option_key(name) for name in FIELDS]:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def live_options(has_gpu: bool) -> RunOptions:
    """The run options the Live form last sent in this tab (those it judges right), else the
    defaults."""
    return RunOptions.from_dict({**defaults_for(has_gpu).to_dict(),
                                 **st.session_state.get(LIVE_OPTIONS, {})})


def option_widget(name: str, default, key: str, label: str | None = None,
                  disabled: bool = False) -> None:
    """One run option as the form draws it, from RunOptions' declaration (its kind, label, help
    and limits): a choice, a flag, text, or a number. No min/max on numbers: Streamlit would
    silently put a wrong value back; the options' judgement names it instead. `disabled`: greyed,
    an option the others make the run ignore (a dataset's sequence length).

    Its value lives in Session State alone: `default` goes there where the key holds none yet,
    and the widget is drawn from it, never given a value as well (a widget given both logged
    Streamlit's "created with a default value but also had its value set via the Session State
    API", with its stack, once a server: `keep_form` sets the state at every run)."""
    field = FIELDS[name]
    label = label or field.label
    if name == "gpus":
        start = list(default)
    elif field.kind == Kind.LIST:
        start = ",".join(default)
    elif field.choices and default in field.choices:
        # The choice itself, a str: a default's StrEnum member (Precision.FP32) in the state of a
        # selectbox of strs is taken for an Enum of another class, and refused.
        start = field.choices[list(field.choices).index(default)]
    else:
        start = default
    st.session_state.setdefault(key, start)
    if name == "gpus":  # several GPUs: pick them among this machine's; none or one: one GPU
        st.multiselect(label, list(range(server.device().gpu_count)), key=key, help=field.help,
                       format_func=lambda g: f"GPU {g}", disabled=disabled)
    elif field.kind == Kind.LIST:  # names comma-separated
        st.text_input(label, key=key, help=f"{field.help}; e.g. {','.join(field.example)}",
                      disabled=disabled)
    elif field.kind == Kind.TEXT and field.choices:  # a list to pick from, or type a path
        held = st.session_state[key]
        choices = list(dict.fromkeys([*field.choices, default, held]))
        st.selectbox(label, choices, key=key, help=field.help, accept_new_options=True,
                     disabled=disabled)
    elif field.kind == Kind.TEXT:
        st.text_input(label, key=key, help=field.help, disabled=disabled)
    elif field.kind == Kind.CHOICE:
        st.selectbox(label, field.choices, key=key, help=field.help, disabled=disabled)
    elif field.kind == Kind.FLAG:
        st.checkbox(label, key=key, help=field.help, disabled=disabled)
    elif field.optional:  # empty: None, what it is without a value (max steps: the epochs)
        st.number_input(label, value=None, step=1, key=key, placeholder=field.unset,
                        help=f"{field.help} ({field.limits()}; empty: {field.unset})",
                        disabled=disabled)
    else:  # a share steps by hundredths (a dropout of 0.05), a whole number by one
        st.number_input(label, step=1 if field.whole else 0.01, key=key,
                        help=f"{field.help} ({field.limits()})", disabled=disabled)
