"""`--metrics-port` and `--metrics-host` (`watch`, `run`): a Prometheus endpoint serving the
run's figures while the command records it (engine/prometheus.py)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator

from anatomy.engine.figures import Figures
from anatomy.engine.prometheus import DEFAULT_HOST, Endpoint, EndpointRefused, serve
from anatomy.store.checks import digits


def _port(text: str) -> int:
    port = digits(text, 65535)  # ASCII digits alone: int() read "٩٤٠٠" as 9400
    if port is None or port < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1 to 65535)")
    return port


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=_port, metavar="PORT", dest="metrics_port",
                        help="serve the run's figures for Prometheus on http://HOST:PORT/metrics "
                             "while it records: each device's memory (labels run, host, rank, "
                             "device, phase), each phase's memory as it ended, the step, the "
                             "predicted peak where known, the samples stored")
    parser.add_argument("--metrics-host", metavar="HOST", dest="metrics_host",
                        help=f"the address --metrics-port listens on (default {DEFAULT_HOST}: "
                             "this machine only; 0.0.0.0 for a cluster's Prometheus)")


@contextlib.contextmanager
def served(args: argparse.Namespace, runs: Callable[[], Iterable[Figures]]
           ) -> Iterator[Endpoint | None]:
    """The endpoint --metrics-port asks for, from here to the block's end (None without it).
    EndpointRefused, in one line, before anything starts: a port taken, a host not ours."""
    if args.metrics_port is None:
        if args.metrics_host is not None:
            raise EndpointRefused("--metrics-host: give --metrics-port too (the endpoint "
                                  "listens only where a port is given)")
        yield None
        return
    endpoint = serve(args.metrics_port, args.metrics_host or DEFAULT_HOST, runs)
    print(f"metrics: {endpoint.address}", file=sys.stderr, flush=True)
    try:
        yield endpoint
    finally:
        endpoint.close()
