"""The /metrics endpoint (engine/prometheus.py) served in this process, scraped over HTTP and read
with prometheus-client's own parser; `--metrics-port` refusals; the Grafana dashboard in docs/
checked against what the endpoint serves."""

from __future__ import annotations

import json
import re
import socket
import sys
import urllib.request

import pytest

from anatomy.cli import main
from anatomy.engine import protocol
from anatomy.engine.figures import Figures
from anatomy.engine.prometheus import EndpointRefused, serve
from anatomy.store import PhaseMark, Sample, Step
from anatomy.vocabulary import Backend
from tests.conftest import PROJECT
from tests.helpers import free_port, one_line

DASHBOARD = PROJECT / "docs" / "grafana-dashboard.json"


def _training_run() -> Figures:
    """A run in its training phase on two GPUs: rank 0 on the first, rank 1 on the second."""
    figures = Figures([0, 1], Backend.NVML, t0=0.0)
    figures.run_id = 7
    for rank in (0, 1):
        figures.see(protocol.Phase(PhaseMark("start", "weights", 0.5),
                                   protocol.Source(rank=rank, device=rank)))
        figures.see(protocol.Samples([Sample(0.9, rank, 1000 + rank, None, None, None)]))
        figures.see(protocol.Phase(PhaseMark("end", "weights", 1.0),
                                   protocol.Source(rank=rank, device=rank)))
        figures.see(protocol.Phase(PhaseMark("start", "training", 1.5),
                                   protocol.Source(rank=rank, device=rank)))
        figures.see(protocol.StepReport(Step(2.0, 4, 10, 0.5, None, None),
                                        protocol.Source(rank=rank, device=rank)))
    figures.see(protocol.Samples([Sample(2.0, 0, 5000, None, None, None),
                                  Sample(2.0, 1, 6000, None, None, None)]))
    figures.predicted_peak = 7000
    figures.stored_samples(4)
    return figures


def _scrape(figures: Figures) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families

    endpoint = serve(free_port(), "127.0.0.1", lambda: [figures])
    try:
        with urllib.request.urlopen(endpoint.address) as answer:
            text = answer.read().decode()
    finally:
        endpoint.close()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_the_endpoint_serves_each_devices_memory_with_its_run_host_rank_and_phase():
    served = _scrape(_training_run())
    memory = {(s.labels["device"], s.labels["rank"], s.labels["phase"]): s.value
              for s in served["anatomy_memory_used_bytes"]}
    assert memory == {("gpu0", "0", "training"): 5000, ("gpu1", "1", "training"): 6000}
    (one,) = served["anatomy_memory_used_bytes"][:1]
    assert one.labels["run"] == "7" and one.labels["host"] == socket.gethostname()
    assert {s.labels["phase"]: s.value for s in served["anatomy_phase_memory_bytes"]} == {
        "weights": 1000}  # rank 0's device, as every reader's phases
    assert {s.labels["rank"]: s.value for s in served["anatomy_step"]} == {"0": 4, "1": 4}
    assert [s.value for s in served["anatomy_predicted_peak_bytes"]] == [7000]
    assert [s.value for s in served["anatomy_samples_stored"] if s.name.endswith("_total")] == [4]
    assert {s.labels["phase"] for s in served["anatomy_phase_start_timestamp_seconds"]} == {
        "weights", "training"}


def test_a_watched_commands_process_phase_gives_way_to_the_phases_it_marks():
    """The phase a watched command is served in before it marks any (`process`, its run's one
    phase if it never does: tests/e2e/test_trackers.py) is no phase of its once its script marks
    its own (`anatomy.start()` under the watch): its memory is in the phase marked, and
    `process` is no phase's start."""
    figures = Figures([0], Backend.NVML, t0=0.0)
    figures.run_id = 3
    figures.until_marked("process", 0.2)
    figures.see(protocol.Samples([Sample(0.5, 0, 1000, None, None, None)]))
    served = _scrape(figures)
    assert [(s.labels["rank"], s.labels["phase"]) for s in served["anatomy_memory_used_bytes"]] \
        == [("", "process")]
    assert [s.labels["phase"] for s in served["anatomy_phase_start_timestamp_seconds"]] == [
        "process"]
    figures.see(protocol.Phase(PhaseMark("start", "baseline", 1.0), protocol.Source()))
    figures.see(protocol.Samples([Sample(1.1, 0, 2000, None, None, None)]))
    served = _scrape(figures)
    assert [(s.labels["rank"], s.labels["phase"]) for s in served["anatomy_memory_used_bytes"]] \
        == [("0", "baseline")]
    assert [s.labels["phase"] for s in served["anatomy_phase_start_timestamp_seconds"]] == [
        "baseline"]


def test_the_readme_lists_every_metric_the_endpoint_serves():
    readme = (PROJECT / "README.md").read_text()
    served = _scrape(_training_run())
    names = {f"{n}_total" if n == "anatomy_samples_stored" else n for n in served}
    assert all(f"`{name}`" in readme for name in names), [n for n in names if n not in readme]


def test_a_port_taken_is_refused_in_one_line_before_the_watch_starts(capsys, store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointRefused, match=f"--metrics-port {port}: cannot listen"):
            serve(port, "127.0.0.1", lambda: [])
        assert main(["watch", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                     "--", sys.executable, "-c", "pass"]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in one_line(capsys.readouterr().err)
    assert store.runs() == []


def test_a_port_taken_leaves_no_store_behind(tmp_path, capsys):
    """`run` and `watch` made their --store before the endpoint was refused: a refused command
    left a new store file behind, though nothing was stored."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command, rest in (("run", ["--model", "tiny", "--max-steps", "1"]),
                              ("watch", ["--", sys.executable, "-c", "pass"])):
            path = tmp_path / f"{command}.sqlite"
            assert main([command, "--store", str(path), "--metrics-port", str(port),
                         "--metrics-host", "127.0.0.1", *rest]) == 2
            assert f"cannot listen on 127.0.0.1:{port}" in one_line(capsys.readouterr().err)
            assert not path.exists(), command


def test_the_endpoints_address_on_an_ipv6_host_is_a_url_that_reaches_it():
    """`--metrics-host ::1` said "metrics: http://::1:9400/metrics", which no client reads."""
    endpoint = serve(0, "::1", lambda: [_training_run()])
    try:
        port = endpoint.server.server_address[1]
        assert endpoint.address == f"http://[::1]:{port}/metrics"
        with urllib.request.urlopen(endpoint.address) as answer:
            assert b"anatomy_memory_used_bytes" in answer.read()
    finally:
        endpoint.close()


@pytest.mark.parametrize("flags, words", [
    (["--metrics-port", "0"], "'0' is not a port"),
    (["--metrics-port", "http"], "'http' is not a port"),
    # Arabic-Indic digits, which int() read as port 9400
    (["--metrics-port", "\u0669\u0664\u0660\u0660"], "'\u0669\u0664\u0660\u0660' is not a port"),
    (["--metrics-port", "\u00b2"], "'\u00b2' is not a port"),
    (["--metrics-host", "0.0.0.0"], "--metrics-host: give --metrics-port too"),
])
def test_bad_metrics_flags_are_one_line(capsys, store, flags, words):
    try:
        status = main(["watch", *flags, "--", sys.executable, "-c", "pass"])
    except SystemExit as exited:  # argparse's refusal of a value
        status = exited.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in err and "Traceback" not in err
    assert store.runs() == []


def test_the_grafana_dashboard_queries_only_what_the_endpoint_serves():
    dashboard = json.loads(DASHBOARD.read_text())
    served = set(_scrape(_training_run()))
    served |= {f"{name}_total" for name in served}  # a counter's sample name
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    (phases,) = dashboard["annotations"]["list"]
    queries.append(phases["expr"])
    metrics = {name for query in queries for name in re.findall(r"\banatomy_[a-z_]+", query)}
    assert metrics and metrics <= served, metrics - served
    # memory per device, drawn over time, each series named by its device and phase
    (memory,) = [p for p in dashboard["panels"]
                 if any("anatomy_memory_used_bytes" in t["expr"] for t in p["targets"])]
    assert memory["type"] == "timeseries" and memory["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert "{{device}}" in memory["targets"][0]["legendFormat"]
    # the phases as annotations, at the time each began (the series' value, in ms)
    assert "anatomy_phase_start_timestamp_seconds" in phases["expr"] and "1000" in phases["expr"]
    assert phases["useValueForTime"] is True and phases["titleFormat"] == "{{phase}}"
    # a Grafana of any name for its Prometheus: the data source is the dashboard's variable
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36


def test_the_dashboard_serves_metrics_for_the_runs_it_starts(store, monkeypatch):
    """`anatomy dashboard --metrics-port` passes the address to its server, whose manager serves
    the runs it records (none yet here: the unit tier starts no run)."""
    from anatomy.dashboard import server
    from anatomy.engine.prometheus import METRICS_ENV
    from tests.apptest import open_page

    port = free_port()
    monkeypatch.setenv(METRICS_ENV, f"127.0.0.1:{port}")
    open_page("screens/runs.py")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
            assert answer.status == 200 and b"anatomy_memory_used_bytes" in answer.read()
    finally:
        server.server_end().stop_runs()


def test_the_dashboards_metrics_port_taken_is_refused_before_streamlit_starts(capsys, store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--port", str(free_port()), "--metrics-port", str(port),
                     "--metrics-host", "127.0.0.1"]) == 2
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in one_line(
        capsys.readouterr().err)
