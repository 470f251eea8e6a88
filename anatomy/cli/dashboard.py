"""`anatomy dashboard`: the dashboard over a store, started as `tensorboard`, `mlflow ui` or
`aim up` start theirs. This process becomes Streamlit's own CLI (`python -m streamlit run`) on
the packaged entry file; the store goes to it through the environment, the server's settings as
Streamlit's flags, so that it serves the same wherever it is started from."""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
from pathlib import Path

from anatomy.cli.arguments import add_store_option
from anatomy.cli.metrics import add_metrics_options
from anatomy.dashboard import ENTRY, READ_ONLY_ENV
from anatomy.engine.prometheus import DEFAULT_HOST as METRICS_HOST
from anatomy.engine.prometheus import METRICS_ENV
from anatomy.store import STORE_ENV, Store, StoreError, checks, resolve_path

# What `pip install "anatomy[dashboard]"` adds (pyproject.toml's extra).
NEEDS = ("streamlit", "plotly", "pandas")
DEFAULT_PORT = 8501  # Streamlit's own
DEFAULT_HOST = "localhost"  # this machine only (also the clone's .streamlit/config.toml)
SETTINGS = {
    "server.headless": "true",  # no browser opened on the serving machine, no e-mail prompt
    # The folder served from may hold a virtualenv: watching it floods inotify on small machines.
    "server.fileWatcherType": "none",
    "client.toolbarMode": "minimal",
    "browser.gatherUsageStats": "false",
    # Light, so the phase bands (views/style.py) stay readable under a dark curve.
    "theme.base": "light",
    "theme.primaryColor": "#009E73",
}


def register(commands: argparse._SubParsersAction) -> None:
    dashboard = commands.add_parser(
        "dashboard", help="serve the dashboard (needs the dashboard extra)",
        description="Serve the dashboard over the run store until Ctrl-C: Live run, Runs,\n"
                    "Compare, Anatomy. Needs pip install \"anatomy[dashboard]\". There is no\n"
                    "authentication: whoever reaches the port can start, stop and delete runs.")
    dashboard.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                           help=f"the port to serve on (default: {DEFAULT_PORT})")
    dashboard.add_argument("--host", default=DEFAULT_HOST,
                           help="the address to serve on (default: localhost, this machine only; "
                                "0.0.0.0: every interface)")
    dashboard.add_argument("--read-only", action="store_true",
                           help="show the runs and write nothing: no Start, Stop, Delete, rename,"
                                " tag or sweep (the mode for a team's shared store; taken by"
                                " itself when the store cannot be written)")
    add_store_option(dashboard)
    add_metrics_options(dashboard)  # the runs the dashboard starts, for Prometheus
    dashboard.set_defaults(func=cmd_dashboard)


def port_number(text: str) -> int:
    port = checks.digits(text, high=65535)
    if not port:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1 to 65535)")
    return port


def cmd_dashboard(args: argparse.Namespace) -> int:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"error: the dashboard needs {', '.join(missing)}: pip install "
              '"anatomy[dashboard]"', file=sys.stderr)
        return 2
    path = resolve_path(args.store)  # a file (absolute: the server's folder may differ) or a URL
    path = path.absolute() if isinstance(path, Path) else path
    read_only = "asked for (--read-only)" if args.read_only else None
    if read_only is None:
        try:
            store = Store(path)  # made if missing; one that is not anatomy's is refused
        except StoreError as error:
            if "cannot be written" not in error.reason:
                raise
            read_only = f"the store cannot be written ({error.reason})"
        else:
            if not store.writable():
                read_only = "the store cannot be written by this user"
    if read_only is not None:
        store = Store(path, read_only=True)
    refusal = _unservable(args.host, args.port)
    if refusal:
        print(f"error: cannot serve on {args.host}:{args.port}: {refusal}", file=sys.stderr)
        return 2
    environment = {**os.environ, STORE_ENV: store.locator(),
                   **({READ_ONLY_ENV: read_only} if read_only else {})}
    if args.metrics_port is None and args.metrics_host is not None:
        print("error: --metrics-host: give --metrics-port too (the endpoint listens only where a "
              "port is given)", file=sys.stderr)
        return 2
    if args.metrics_port is not None:
        metrics_host = args.metrics_host or METRICS_HOST
        refusal = _unservable(metrics_host, args.metrics_port)
        if refusal:
            print(f"error: --metrics-port {args.metrics_port}: cannot listen on {metrics_host}:"
                  f"{args.metrics_port} ({refusal})", file=sys.stderr)
            return 2
        environment[METRICS_ENV] = f"{metrics_host}:{args.metrics_port}"
        print(f"metrics: http://{metrics_host}:{args.metrics_port}/metrics (the runs it starts, "
              "from the first page served)", flush=True)
    shown = "localhost" if args.host in ("0.0.0.0", "::") else args.host
    # The pid, because the process becomes Streamlit's (below): `kill PID` stops it, where a
    # search for "anatomy dashboard" among the processes finds nothing.
    mode = f" · read-only: {read_only}" if read_only else ""
    print(f"anatomy dashboard: http://{shown}:{args.port} · store {path}{mode} · pid"
          f" {os.getpid()} (Ctrl-C stops it)", flush=True)
    command = [sys.executable, "-m", "streamlit", "run", str(ENTRY),
               "--server.address", args.host, "--server.port", str(args.port),
               *(f"--{key}={value}" for key, value in SETTINGS.items())]
    # exec, not a child: Ctrl-C and a SIGTERM reach the server itself, and nothing outlives it.
    os.execve(sys.executable, command, environment)


def _unservable(host: str, port: int) -> str | None:
    """Why `host`:`port` cannot be served on (an unknown address, a port taken), or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as error:
        return f"unknown address ({error.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            probe.bind(address)
        except OSError as error:
            return error.strerror or str(error)
    return None
