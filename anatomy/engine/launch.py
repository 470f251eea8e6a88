"""Ranks on several hosts, one run: `anatomy watch -- torchrun --nnodes 2 --rdzv-id JOB …` on
every host of a launch, each writing its own GPUs' samples and its ranks' phases and steps
straight into the one run in a store every host reaches (PostgreSQL; store/launches.py).

The hosts find their run by a key every host of the launch has: ANATOMY_RUN_KEY, else torchrun's
rendezvous id (`--rdzv-id`, or PET_RDZV_ID, as torchrun reads it; torchrun hands it to its ranks as
TORCHELASTIC_RUN_ID). How many hosts the run has: torchrun's `--nnodes` (PET_NNODES; of an
elastic MIN:MAX, MAX; its ranks see GROUP_WORLD_SIZE), else ANATOMY_RUN_HOSTS, else those that
came. Without `watch`, a script that records itself (the phase API, the Trainer callback) is
its host's part where it is the host's first rank (LOCAL_RANK 0): `rank_launch`. The first host to arrive
makes the run; each host's recording counts from that host's start (the wall clocks of the two
starts), and its GPU i is stored as `device_key(host, i)`.

Each host beats every BEAT_SECONDS in the store; a host silent for SILENT_SECONDS (its machine,
its watch or its network gone) is lost: the first host to see it ends that host's part failed,
naming it, and every host ends its own command (ranks whose peer is gone can only fail or hang).
The run ends when every host's part has ended: the last one writes the run's ending from all of
theirs (a host lost is the cause, else the first whose part did not complete, else completed).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from anatomy.analysis.machine import Machine
from anatomy.engine.endings import Ending
from anatomy.store import DatabaseError, RunFacts, RunSource, ServerUrl, Store, checks, launches, store_error
from anatomy.store.launches import HostRow, LaunchRefused, Place
from anatomy.store.liveness import Recorder
from anatomy.vocabulary import Status

__all__ = ["LaunchRefused"]

RUN_KEY_ENV = "ANATOMY_RUN_KEY"
RUN_HOSTS_ENV = "ANATOMY_RUN_HOSTS"
# How a command names its store, for the refusal of a file: the CLI's flag, or a script's words.
STORE_FLAG = "--store postgresql://user@host/db (or $ANATOMY_STORE)"
BEAT_SECONDS = 1.0
SILENT_SECONDS = 10.0  # a host silent this long is lost (its machine or its network is gone)
# A host that ended waits this long for the hosts of the launch that never came.
ARRIVAL_SECONDS = SILENT_SECONDS
LOST = "lost"  # a host's part, ended by another host that found it silent

# torchrun's options that take no value; every other option takes one.
_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path",
          "--run_path", "--use-env", "--use_env"}
_LAUNCHERS = {"torch.distributed.run", "torch.distributed.launch"}


@dataclass(frozen=True)
class Launch:
    """A launch across hosts: the key its hosts share, how many they are (None: not said), and
    where each came from, in words for a refusal."""
    key: str
    hosts: int | None
    said: str


def _torchrun_options(command: Sequence[str]) -> dict[str, str] | None:
    """torchrun's own options in `command` (`torchrun …`, `python -m torch.distributed.run …`),
    up to the script it runs; None for another command."""
    start = None
    for i, word in enumerate(command):
        if os.path.basename(word) == "torchrun":
            start = i + 1
            break
        if word == "-m" and i + 1 < len(command) and command[i + 1] in _LAUNCHERS:
            start = i + 2
            break
    if start is None:
        return None
    options: dict[str, str] = {}
    words = iter(command[start:])
    for word in words:
        if not word.startswith("-"):
            break  # the script: what follows is its own
        name, equals, value = word.partition("=")
        if not equals and name not in _FLAGS:
            value = next(words, "")
        options[name.replace("_", "-")] = value
    return options


def _node_count(text: str) -> int | None:
    """`--nnodes` as torchrun takes it: N, or MIN:MAX (MAX: the hosts that may come)."""
    return checks.digits(text.rpartition(":")[2].strip())


def launch_of(command: Sequence[str], environ: Mapping[str, str] = os.environ) -> Launch | None:
    """The launch across hosts this command is one host of, None for a command of one host.
    LaunchRefused where it runs on several hosts that nothing joins into one run (torchrun's
    default rendezvous id, "none", is no key)."""
    torchrun = _torchrun_options(command)
    options = {} if torchrun is None else {
        "--nnodes": environ.get("PET_NNODES", ""), "--rdzv-id": environ.get("PET_RDZV_ID", ""),
        **{k: v for k, v in torchrun.items() if k in ("--nnodes", "--rdzv-id")}}
    return _launch(options.get("--nnodes", ""), options.get("--rdzv-id", ""), environ)


def rank_launch(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """The launch across hosts a process torchrun started is a rank of, as torchrun tells its
    ranks (GROUP_WORLD_SIZE: its hosts; TORCHELASTIC_RUN_ID: its --rdzv-id); None for one host.
    LaunchRefused as `launch_of`."""
    return _launch(environ.get("GROUP_WORLD_SIZE", ""), environ.get("TORCHELASTIC_RUN_ID", ""),
                   environ)


def _launch(nnodes: str, rdzv_id: str, environ: Mapping[str, str]) -> Launch | None:
    """The launch of torchrun's `--nnodes` and `--rdzv-id` as given (blank: not given), or the
    environment's key and host count."""
    nodes = _node_count(nnodes) if nnodes else None
    given = environ.get(RUN_HOSTS_ENV, "")
    if nodes is None and given:
        nodes = checks.digits(given)
        if not nodes:
            raise LaunchRefused(f"{RUN_HOSTS_ENV}={given!r}: not a number of hosts (e.g. 2)")
    key = environ.get(RUN_KEY_ENV, "").strip()
    said = f"{RUN_KEY_ENV}={key!r}" if key else ""
    # torchrun's id names a launch across hosts only where it has several: a one-node
    # torchrun given an id (as its examples do) is one host's run.
    if not key and (nodes or 1) > 1 and rdzv_id not in ("", "none"):
        key, said = rdzv_id, f"torchrun --rdzv-id {rdzv_id}"
    if not key:
        if nodes is not None and nodes > 1:
            launched = f"torchrun --nnodes {nnodes}" if nnodes else f"{RUN_HOSTS_ENV}={given}"
            raise LaunchRefused(f"{launched}: give every host the same --rdzv-id (or"
                                f" {RUN_KEY_ENV}), by which their recordings make one run")
        return None
    if nodes is not None:
        said += f", {nodes} hosts"
    return Launch(key, nodes, said)


def refuse_file(store: Path | ServerUrl, launch: Launch, given: str = STORE_FLAG) -> None:
    """A run across hosts is written by every host into one store: a SQLite file is one
    machine's. Refused in one line, the URL's form shown as the command takes it (`given`)."""
    if not isinstance(store, ServerUrl):
        raise LaunchRefused(f"a run across hosts ({launch.said}) needs a store every host reaches:"
                            f" {given}, not the file {store}")


def arrive(store: Store, launch: Launch, info: Machine, gpu: int, environment: RunFacts,
           source: RunSource, preset: str, name: str | None) -> Place:
    """This host's place in its launch's run: made, or joined (store/launches.py). StoreError
    where the store cannot be reached."""
    try:
        return launches.join(
            store, launch.key, launch.hosts, socket.gethostname(), time.time(), SILENT_SECONDS,
            backend=info.backend, memory_api=info.memory_api, gpu=gpu, environment=environment,
            source=source, preset=preset, run_name=name)
    except DatabaseError as error:
        raise store_error(store.path, error) from None


def run_clock(place: Place) -> float:
    """The run's clock on this machine's monotonic one (a recording's t0): the wall clock at host
    0's start, so that every host's times count from it."""
    return time.monotonic() - (time.time() - place.run_wall_t0)


def run_ending(hosts: Sequence[HostRow]) -> tuple[Status, str | None]:
    """The run's ending from every host's part: a host lost is the cause (the ranks elsewhere
    fail after it, or are ended), else the first host whose part did not complete (failed, out
    of memory or stopped: the others' ranks then lost their peer), else completed."""
    by_time = sorted(hosts, key=lambda h: h.ended_at or 0.0)
    lost = [h for h in by_time if h.status == LOST]
    if lost:
        return Status.FAILED, (f"host {lost[0].name} was lost: {lost[0].error}; the training on"
                               " the other hosts was ended")
    first = next((h for h in by_time if h.status != Status.COMPLETED), None)
    if first is not None:
        status = Status._value2member_map_.get(first.status, Status.FAILED)
        return status, f"host {first.name}: {first.error}"
    return Status.COMPLETED, None


class HostPart:
    """This host's part of a run across hosts: it beats, watches the others' beats, places its
    ranks, and, once its command has ended, ends its part and — the last to end — the run.
    `on_lost(words)` is called (from its thread) when another host is lost or ended failed: the
    command here is to be ended. `tell(text)` says what the user should know."""

    def __init__(self, store: Store, launch: Launch, place: Place,
                 on_lost: Callable[[str], None], tell: Callable[[str], None]):
        self.store, self.launch, self.place = store, launch, place
        self.on_lost, self.tell = on_lost, tell
        self.ranks: dict[int, int | None] = {}  # this host's ranks, each one's GPU (NVML) here
        self.ended_others: str | None = None  # why this host's command is to end: another host
        self.leave = threading.Event()  # stop waiting for the other hosts: they end the run
        self._over = threading.Event()
        self._failed_seen: float | None = None
        self._unplaced = False  # ranks the run's facts do not place yet
        self._shared: set[int] = set()  # its ranks another host records too, said
        self._beating_since: float | None = None  # since the server last answered every beat
        self._thread: threading.Thread | None = None

    @property
    def run_id(self) -> int:
        return self.place.run_id

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="anatomy-host-beat", daemon=True)
        self._thread.start()

    def place_rank(self, rank: int, gpu: int | None) -> None:
        """A rank of this host has spoken: the run's facts say where it trains (a database
        server away now: once it is back, by the next beat)."""
        self.ranks[rank] = gpu
        self._place()

    def heard(self, rank: int, local: int | None, gpus: Sequence[int]) -> None:
        """A rank of this host has marked a phase or a step: placed, once, on the GPU its
        LOCAL_RANK `local` names among this host's (`gpus`, NVML indices; none: the CPU)."""
        if rank not in self.ranks:
            self.place_rank(rank, gpus[min(local or 0, len(gpus) - 1)] if gpus else None)

    def _place(self) -> None:
        self._unplaced = True
        try:
            shared = launches.place_ranks(self.store, self.run_id, self.place.host,
                                          dict(self.ranks))
        except DatabaseError:
            return
        self._unplaced = False
        for rank, other in sorted(shared.items()):
            if rank not in self._shared:
                self._shared.add(rank)
                self.tell(f"rank {rank} of this host is rank {rank} of host {other} too: their"
                          " phases and steps are stored as one rank's; give every host's"
                          " processes the launch's own RANK (torchrun --nnodes N --node-rank K,"
                          " accelerate launch --num_machines N --machine_rank K set it)")

    def _beat(self) -> None:
        while not self._over.wait(BEAT_SECONDS):
            try:
                hosts = launches.beat(self.store, self.run_id, self.place.host)
            except DatabaseError:
                self._beating_since = None  # the server away: the collector says so
                continue
            if self._beating_since is None:
                self._beating_since = time.monotonic()
            if self._unplaced:
                self._place()
            # Every host's beats stop while the server is away: silence is judged only once
            # this host has beaten as long as a host may be silent.
            if time.monotonic() - self._beating_since > SILENT_SECONDS:
                self._look(hosts)

    def _look(self, hosts: Sequence[HostRow]) -> None:
        """Another host silent too long is lost; one lost or failed ends the command here."""
        for host in hosts:
            if host.host == self.place.host or host.over or host.silent <= SILENT_SECONDS:
                continue
            why = f"silent for {host.silent:.0f} s (its recording stopped reporting)"
            try:
                lost = launches.lose(self.store, self.run_id, host.host, why, Recorder.here(),
                                     status=LOST)
            except DatabaseError:
                continue
            if lost:
                self.tell(f"host {host.name} was lost: {why}")
        if self.ended_others is not None:
            return
        others = [h for h in hosts if h.host != self.place.host and h.over]
        lost = next((h for h in others if h.status == LOST), None)
        failed = next((h for h in others if h.status in (Status.FAILED, Status.OOM,
                                                          Status.STOPPED)), None)
        if lost is not None:
            self.ended_others = f"host {lost.name} was lost"
        elif failed is not None:
            # Its ranks' peers here fail of it on their own, saying how; those that hang (a
            # collective waiting on a peer that is gone) are ended once they had as long as a
            # silent host has.
            self._failed_seen = self._failed_seen or time.monotonic()
            if time.monotonic() - self._failed_seen >= SILENT_SECONDS:
                self.ended_others = f"host {failed.name} {failed.status}"
        if self.ended_others is not None:
            self.on_lost(self.ended_others)

    def end(self, ending: Ending, samples_sent: int | None) -> Ending | None:
        """This host's part ended as `ending`; then, once every host's part has ended (or
        `leave` is set), the run's ending if this host wrote it (None: another host did, or
        will)."""
        launches.end_part(self.store, self.run_id, self.place.host, ending.status, ending.error,
                          samples_sent)
        ended_at = time.monotonic()
        waiting_said = False
        try:
            while True:
                hosts = launches.hosts(self.store, self.run_id)
                missing = (self.launch.hosts or 0) - len(hosts)
                if missing > 0 and time.monotonic() - ended_at < ARRIVAL_SECONDS \
                        and not self.leave.is_set():
                    time.sleep(BEAT_SECONDS)
                    continue
                written = launches.finish(self.store, self.run_id, run_ending)
                if written is not None:
                    if missing > 0:
                        self.tell(f"{len(hosts)} of the launch's {self.launch.hosts} hosts came to"
                                  " its run: the others' watches were not given its key, or were"
                                  " not started")
                    return Ending(*written)
                running = [h.name for h in hosts if not h.over]
                if not running:
                    return None  # another host wrote it
                if self.leave.is_set():
                    self.tell(f"leaving the run's ending to {', '.join(running)}")
                    return None
                if not waiting_said:
                    self.tell(f"this host's part ended {ending.status}; waiting for"
                              f" {', '.join(running)} to end the run")
                    waiting_said = True
                time.sleep(BEAT_SECONDS)
        finally:
            self._over.set()
