"""How the processes of a command under `anatomy watch` reach the watch's recording: the
environment the watch sets for its command, and the local socket the command's processes send
their phase marks and steps through (the phase API, the Trainer callback).

The socket is in Linux's abstract namespace: it is no file, so a watch killed with `kill -9`
leaves nothing behind. It is authenticated with a random key given in the environment.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass

# Set by `anatomy watch` for the command it runs: where its collector listens, the key to connect
# with, and the run's clock (time.monotonic() at its start: one clock per machine).
WATCH_ENV = "ANATOMY_WATCH"
WATCH_KEY_ENV = "ANATOMY_WATCH_KEY"
T0_ENV = "ANATOMY_T0"
# Set by a watch that is one host of a run across hosts: the rank of a process of its command
# that its launcher gave none (no RANK: `python train.py` on each host, ANATOMY_RUN_KEY joining
# them): its host's place, each such host running one process. Without it every host's process
# was rank 0, and the run held each phase and step once a host under one rank.
HOST_RANK_ENV = "ANATOMY_HOST_RANK"

ABSTRACT = "@"  # how an abstract socket's name is written where a NUL byte cannot go


def new_address() -> str:
    """A fresh socket address as the environment carries it."""
    name = f"anatomy-watch-{secrets.token_hex(8)}"
    if sys.platform.startswith("linux"):
        return ABSTRACT + name
    import tempfile

    return f"{tempfile.gettempdir()}/{name}.sock"  # elsewhere a file, removed when it closes


def socket_address(address: str) -> str:
    """The address as the socket takes it."""
    return "\0" + address[1:] if address.startswith(ABSTRACT) else address


@dataclass(frozen=True)
class Ready:
    """What the watch tells each process that connects, once its sampler has measured: the
    run's id."""

    run_id: int
