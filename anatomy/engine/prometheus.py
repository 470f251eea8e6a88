"""The /metrics endpoint (`--metrics-port`): the live figures of the runs this process records,
for Prometheus, on prometheus-client's own HTTP server (a thread). Each scrape reads the figures
as they are (a custom collector, as exporters do): nothing is copied between scrapes.
prometheus-client is imported only when an endpoint is asked for.

Every series carries `run` and `host`; memory also `rank`, `device` and `phase` (the phase the
rank training on that device is in; empty between phases; "process" for a watched command that
marks none, its run's one phase), so that a cluster's Grafana can say which phase filled a GPU.
docs/grafana-dashboard.json draws them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

from anatomy.engine.figures import Figures
from anatomy.store.checks import digits

PRIVILEGED_BELOW = 1024  # Linux's ports that only root (or CAP_NET_BIND_SERVICE) may listen on
DEFAULT_HOST = "localhost"  # nobody else's to read unless --metrics-host says so
# `anatomy dashboard --metrics-port` to its server (which Streamlit runs): "HOST:PORT"
METRICS_ENV = "ANATOMY_METRICS"


def from_environment() -> tuple[str, int] | None:
    """The (host, port) $ANATOMY_METRICS names, None where it names none."""
    host, _, port = os.environ.get(METRICS_ENV, "").rpartition(":")
    number = digits(port, 65535)  # "²" passes str.isdigit() and int() refuses it
    return (host, number) if host and number else None


class EndpointRefused(Exception):
    """The endpoint cannot listen where it was asked to: one line."""


class _RunsCollector:
    """prometheus-client's collector protocol: `collect()` yields metric families."""

    def __init__(self, runs: Callable[[], Iterable[Figures]], host: str):
        self.runs, self.host = runs, host

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        memory = GaugeMetricFamily(
            "anatomy_memory_used_bytes", "A device's memory at its latest sample: NVML's used "
            "memory of a GPU (device gpuN), or the resident memory of the training's processes "
            "(device cpu)", labels=["run", "host", "rank", "device", "phase"])
        peak = GaugeMetricFamily("anatomy_memory_peak_bytes", "A device's highest sample of the "
                                 "run so far", labels=["run", "host", "device"])
        phases = GaugeMetricFamily("anatomy_phase_memory_bytes", "The run's device's memory as "
                                   "the phase ended (its last sample at the end)",
                                   labels=["run", "host", "phase"])
        starts = GaugeMetricFamily("anatomy_phase_start_timestamp_seconds", "When the phase "
                                   "last began (Grafana's annotations)",
                                   labels=["run", "host", "rank", "phase"])
        steps = GaugeMetricFamily("anatomy_step", "The rank's last optimizer step",
                                  labels=["run", "host", "rank"])
        predicted = GaugeMetricFamily("anatomy_predicted_peak_bytes", "The prediction's peak "
                                      "for the run's options, where one is known",
                                      labels=["run", "host"])
        stored = CounterMetricFamily("anatomy_samples_stored", "Samples written into the store",
                                     labels=["run", "host"])
        for figures in self.runs():
            if figures.run_id is None:
                continue
            run = str(figures.run_id)
            for device in figures.devices_now():
                rank = "" if device.rank is None else str(device.rank)
                memory.add_metric([run, self.host, rank, device.label, device.phase or ""],
                                  device.used)
                peak.add_metric([run, self.host, device.label], device.peak)
            for name, used in figures.phase_memory():
                phases.add_metric([run, self.host, name], used)
            for start in figures.phase_starts():
                starts.add_metric([run, self.host, str(start.rank), start.name], start.at)
            for rank, step in figures.steps().items():
                steps.add_metric([run, self.host, str(rank)], step)
            if figures.predicted_peak is not None:
                predicted.add_metric([run, self.host], figures.predicted_peak)
            stored.add_metric([run, self.host], figures.stored)
        yield from (memory, peak, phases, starts, steps, predicted, stored)


class Endpoint:
    """A listening /metrics endpoint; `close()` ends it."""

    def __init__(self, server, thread, address: str):
        self.server, self.thread, self.address = server, thread, address
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve(port: int, host: str, runs: Callable[[], Iterable[Figures]]) -> Endpoint:
    """Serve the figures of `runs()` (read at each scrape) on http://host:port/metrics;
    EndpointRefused, in one line, where it cannot listen."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunsCollector(runs, socket.gethostname()))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        why = error.strerror or str(error)
        if isinstance(error, PermissionError) and port < PRIVILEGED_BELOW:
            why += (f": a port below {PRIVILEGED_BELOW} is root's, or needs the capability"
                    f" CAP_NET_BIND_SERVICE; give one from {PRIVILEGED_BELOW}")
        raise EndpointRefused(f"--metrics-port {port}: cannot listen on {host}:{port} "
                              f"({why})") from None
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL
    return Endpoint(server, thread, f"http://{shown}:{server.server_address[1]}/metrics")
