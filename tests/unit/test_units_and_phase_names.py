"""One unit family and one name a phase, on every front: sizes in MiB and GiB (the figures are
bytes // 2**20, as the walkthrough, nvidia-smi and PyTorch count them), the kernel phase "CUDA
kernels" on a GPU and "torch loaded" on a CPU — on each page, in the CLI and in an export."""

from __future__ import annotations

import json
import re

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis.report import report
from anatomy.cli import main
from anatomy.cli.render import PhaseEnds
from anatomy.dashboard.widgets import INTERACTIVE
from anatomy.store import PhaseMark, Sample
from anatomy.units import GIB, MIB, gib_text, mib_text, size_text
from anatomy.views import compare as compare_view
from anatomy.views import export
from tests.apptest import APP, TIMEOUT, open_page

DECIMAL = re.compile(r"\b[KMGT]B\b")  # a decimal unit, or "MB" meaning MiB
RAW_KERNEL = re.compile(r"\bkernel\b")  # the phase's stored name, where its name is shown


def _shown(app: AppTest) -> str:
    """Everything a page shows in words: headings, text, metrics, tables, the charts' specs."""
    assert not app.exception, app.exception
    parts = [str(e.value) for kind in ("title", "subheader", "markdown", "caption", "success",
                                        "info", "warning", "error", "code")
             for e in app.get(kind)]
    parts += [f"{m.label} {m.value} {m.proto.delta}" for m in app.metric]
    parts += [f"{list(d.value.columns)} {d.value.to_string()}" for d in app.dataframe]
    parts += [_drawn(c.proto.spec) for c in app.get("plotly_chart")]
    parts += [f"{s.label} {s.options}" for s in app.selectbox]
    return "\n".join(parts)


def _drawn(spec: str) -> str:
    """A chart's spec less the names of its shapes and annotations: keys, never drawn."""
    figure = json.loads(spec)
    for key in ("shapes", "annotations"):
        for item in figure.get("layout", {}).get(key, []):
            item.pop("name", None)
    return json.dumps(figure, ensure_ascii=False)


def _live(run_id: int) -> AppTest:
    """The Live page showing a finished run, as after its Start."""
    app = AppTest.from_file(APP, default_timeout=TIMEOUT)
    app.session_state[INTERACTIVE] = True
    app.session_state["live_run"] = run_id
    return app.run()


def _cli(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_the_units_say_what_the_figures_are():
    assert mib_text(1536 * MIB + MIB // 2) == "1,536 MiB"  # whole MiB, rounded down as `mib`
    assert gib_text(139.8 * GIB) == "139.8 GiB"
    assert (size_text(345 * MIB), size_text(1.25 * GIB)) == ("345 MiB", "1.2 GiB")


def test_every_page_says_its_sizes_in_mib_and_gib_and_names_the_kernel_phase_by_its_device(
        store, seed, seed_users):
    gpu, cpu = seed(gpus=2), seed(backend="cpu-rss")
    trainer = seed_users("trainer")
    pages = {
        "live": _live(gpu),
        "runs": open_page("screens/runs.py", run=str(gpu)),
        "runs (CPU)": open_page("screens/runs.py", run=str(cpu)),
        "compare": open_page("screens/compare.py", runs=f"{gpu},{cpu},{trainer}"),
    }
    for page, app in pages.items():
        shown = _shown(app)
        assert DECIMAL.findall(shown) == [], page
        assert "MiB" in shown, page
        assert RAW_KERNEL.findall(shown) == [], page
    assert "GiB" in _shown(pages["runs"])  # the device's total
    # The phases by the names of the run shown: a GPU's, on this machine without one too.
    assert "anatomy*: baseline, CUDA kernels, weights, training." in _shown(pages["live"])
    assert "CUDA kernels" in _shown(pages["runs"]) and "torch loaded" in _shown(pages["runs (CPU)"])
    # Runs of both kinds side by side: the phase by both its names.
    assert "CUDA kernels / torch loaded (MiB)" in pages["compare"].dataframe[0].value.index
    reports = [report(store, i) for i in (gpu, cpu)]
    assert "torch loaded" in compare_view.not_drawn(reports + [report(store, trainer)], "kernel")


def test_the_anatomy_page_says_mib(store, seed_users):
    app = open_page("screens/anatomy.py", timeout=300, run=str(seed_users("trainer")))
    shown = _shown(app)
    assert DECIMAL.findall(shown) == [] and "MiB" in shown


def test_the_cli_and_an_export_say_mib_and_the_phases_by_their_device(store, seed, capsys):
    gpu, cpu = seed(gpus=2), seed(backend="cpu-rss")
    shown = _cli(capsys, "show", str(gpu), "--store", str(store.path))
    assert "memory at end (MiB)" in shown and "peak: 4,096 MiB" in shown
    assert "\nCUDA kernels " in shown
    assert "\ntorch loaded " in _cli(capsys, "show", str(cpu), "--store", str(store.path))
    listed = _cli(capsys, "runs", "--store", str(store.path))
    for text in (shown, listed):
        assert DECIMAL.findall(text) == [] and RAW_KERNEL.findall(text) == [], text
    page = export.runs_html(store, [gpu])
    assert "peak 4,096 MiB" in page and DECIMAL.findall(page.split("<script")[0]) == []


def test_run_and_watch_print_each_phase_with_the_figures_show_prints(store, seed, capsys):
    """The lines `anatomy run` and `watch` print as each phase ends come from the run's report:
    `show`'s figures, by the names `show` gives them."""
    run_id = seed()
    lines = PhaseEnds(store).new(report(store, run_id))
    assert lines == [f"GPU memory occupied: {mb} MiB.  ({name})" for mb, name in (
        ("1,024", "baseline"), ("2,048", "CUDA kernels"), ("3,072", "weights"),
        ("4,096", "training"))]
    shown = _cli(capsys, "show", str(run_id), "--store", str(store.path))
    for mb, name in (("1024", "baseline"), ("2048", "CUDA kernels"), ("4096", "training")):
        assert re.search(rf"^{name} +[\d.]+ +{mb} *$", shown, re.M), shown
    cpu = seed(backend="cpu-rss")
    assert PhaseEnds(store).new(report(store, cpu))[1] == \
        "CPU memory (RSS) occupied: 2,048 MiB.  (torch loaded)"


def test_a_phase_is_said_once_the_samples_have_passed_its_end(store):
    """Its memory is the last sample before its end: printed before that sample reached the
    store, the line said an earlier one (`watch` printed 776 where `show` said 735)."""
    run_id = store.create_run({}, "cpu-rss", "rss", 0, {}, preset="train.py")
    store.write(run_id, samples=[Sample(t / 10, 0, 100 * MIB, None, None, None)
                                 for t in range(10)],
                phases=[PhaseMark("start", "weights", 0.1), PhaseMark("end", "weights", 1.2)])
    ends = PhaseEnds(store)
    assert ends.new(report(store, run_id)) == []  # sampled to 0.9 s: the end's reading may come
    store.write(run_id, samples=[Sample(1.1, 0, 120 * MIB, None, None, None),
                                 Sample(1.3, 0, 150 * MIB, None, None, None)])
    assert ends.new(report(store, run_id)) == [
        "CPU memory (RSS) occupied: 120 MiB.  (weights)"]
    assert ends.new(report(store, run_id)) == []  # said once


@pytest.mark.parametrize("held", [(), ("training",)])
def test_what_a_command_says_elsewhere_is_not_said_twice(store, seed, held):
    lines = PhaseEnds(store, held).new(report(store, seed()))
    assert len(lines) == 4 - len(held)
