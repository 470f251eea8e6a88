"""Ranks on several hosts, one run: `anatomy watch --join HOST:PORT -- COMMAND` on
every host of a job, the address given once to all of them, as torchrun's rendezvous endpoint is.

The watch that can listen on HOST:PORT is the run's host: it records the run (its store, its
recording, engine/recording.py) and its own GPUs, as any watch does. Every other host's watch
joins it over TCP: it runs its part of the command, samples its own GPUs with a sampler of its
own, hears its ranks over its local socket (engine/link.py), and forwards all of it — the
protocol's messages, as they are — to the run's host, where they are one more source of the one
recording: a host's GPU i is stored as `device_key(host, i)`, its times moved onto the run's
clock (the hosts' wall clocks at their starts, told at joining), each rank's host kept in the
run's facts (`hosts`, `rank_hosts`).

The link is multiprocessing.connection's, authenticated with a key every host is given once
(ANATOMY_JOIN_KEY: an HMAC challenge, never the key, crosses the network); a message is at most
MAX_MESSAGE_BYTES; each side beats every BEAT_SECONDS, and a host silent for SILENT_SECONDS, or
whose connection closes before it said how its command ended, is lost: the run fails naming it,
and every other host's command is stopped (ranks whose peer is gone can only hang).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from typing import Any, NamedTuple

from anatomy.engine import protocol
from anatomy.engine.endings import death
from anatomy.store import RunFacts, checks, device_key

JOIN_KEY_ENV = "ANATOMY_JOIN_KEY"
BEAT_SECONDS = 1.0
SILENT_SECONDS = 10.0  # a host silent this long is lost (its machine or its network is gone)
CONNECT_SECONDS = 60.0  # a joining host waits this long for the run's host to listen
MAX_MESSAGE_BYTES = 16 * 2**20
FORWARD_SECONDS = 0.1  # a joining host sends what it gathered this often
# Messages a joining host holds for the run's host at most: one that cannot send this much stops
# forwarding rather than grow without end (its command goes on, unrecorded).
OUTBOX_MESSAGES = 20_000


class JoinRefused(ValueError):
    """Bad input to `--join`: nothing was started."""


class JoinAddress(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def join_address(text: str) -> JoinAddress:
    """HOST:PORT, as torchrun's --rdzv-endpoint is written."""
    host, _, word = text.rpartition(":")
    port = checks.digits(word, high=65535)
    if not host or not port:
        raise JoinRefused(f"--join {text!r}: not HOST:PORT (e.g. node-0:29600)")
    return JoinAddress(host.strip("[]"), port)


def join_key() -> bytes:
    """The key every host of the run is given, from ANATOMY_JOIN_KEY."""
    key = os.environ.get(JOIN_KEY_ENV, "")
    if not key:
        raise JoinRefused(f"--join needs the run's key in {JOIN_KEY_ENV}, the same on every host"
                          f" (e.g. export {JOIN_KEY_ENV}=$(openssl rand -hex 16) where the job "
                          "starts)")
    return key.encode()


# --- what travels between the hosts ---

@dataclass(frozen=True)
class Hello:
    """A joining host: its name, the GPUs it samples (NVML indices, in torch's order: a rank's
    LOCAL_RANK indexes them), its backend, and the wall clock at its recording's start."""
    host: str
    gpus: tuple[int, ...]
    backend: str
    wall_at_start: float


@dataclass(frozen=True)
class Welcome:
    """The run's host's answer: the run and this host's place among the run's hosts (1, 2, …)."""
    run_id: int
    index: int


@dataclass(frozen=True)
class Forward:
    """What a joining host gathered since its last: its sampler's and its ranks' messages."""
    messages: list


@dataclass(frozen=True)
class Beat:
    """Still here (sent when there is nothing to forward)."""


@dataclass(frozen=True)
class Left:
    """A joining host's last word: its command's exit code (None: it was lost), and why the
    watch there ended it, if it did."""
    code: int | None
    why: str | None = None


@dataclass(frozen=True)
class Stop:
    """The run's host to a joining host: end your command (the run is stopped or failed)."""
    reason: str


def send(connection: Connection, message: Any) -> None:
    connection.send_bytes(pickle.dumps(message))


def receive(connection: Connection, timeout: float) -> Any | None:
    """The next message, or None after `timeout` seconds of silence. EOFError, OSError: the
    connection is gone (or sent more than MAX_MESSAGE_BYTES)."""
    if not connection.poll(timeout):
        return None
    return pickle.loads(connection.recv_bytes(MAX_MESSAGE_BYTES))


def listen(address: JoinAddress, key: bytes) -> Listener | None:
    """The run's host's listener on `address`; None where this host cannot listen there (the
    address is another machine's, or another watch listens on it already: this one joins)."""
    try:
        return Listener((address.host, address.port), family="AF_INET", authkey=key)
    except OSError:
        return None


def wall_at(t0: float) -> float:
    """The wall clock at monotonic time `t0`."""
    return time.time() - (time.monotonic() - t0)


# --- on the run's host: the other hosts as a source of its recording ---

@dataclass
class Member:
    """A host that joined the run."""
    index: int
    name: str
    gpus: tuple[int, ...]
    shift: float  # seconds to add to its times: they count from its own start
    left: Left | None = None
    lost: str | None = None  # why it was lost, and when
    sent: int | None = None  # the samples its sampler sent
    seen: float = field(default_factory=time.monotonic)


class Hosts:
    """The hosts that join the run on the run's host: each one's messages, moved onto the run's
    devices and clock, go to the recording's queues (samples, events) as its own processes' do.
    `on_lost(member)` is called once when a host is lost, `on_join()` when one joins."""

    def __init__(self, listener: Listener, name: str, t0: float, samples, events,
                 on_lost: Callable[[Member], None], on_join: Callable[[], None]):
        self.listener, self.name, self.t0 = listener, name, t0
        self.samples, self.events = samples, events
        self.on_lost, self.on_join = on_lost, on_join
        self.run_id: int | None = None
        self.members: list[Member] = []
        self.rank_places: dict[int, tuple[int, int | None]] = {}  # rank -> (host, NVML index)
        self._connections: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self, run_id: int) -> None:
        self.run_id = run_id
        threading.Thread(target=self._accept, name="anatomy-hosts-accept", daemon=True).start()

    @property
    def names(self) -> list[str]:
        return [self.name, *(m.name for m in self.members)]

    def all_left(self) -> bool:
        return all(m.left is not None or m.lost is not None for m in self.members)

    def lost(self) -> Member | None:
        return next((m for m in self.members if m.lost is not None), None)

    def failed(self) -> tuple[Member, str] | None:
        """The first host whose command failed, and how."""
        for member in self.members:
            if member.left is not None and member.left.code not in (0, None):
                why = member.left.why or f"the command {death(member.left.code)}"
                return member, why
        return None

    def samples_sent(self) -> int | None:
        """The samples the joined hosts' samplers sent; None when one's count never came."""
        counts = [m.sent for m in self.members]
        return None if None in counts else sum(counts)

    def stop_all(self, reason: str) -> None:
        """Tell every host still in the run to end its command."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            with contextlib.suppress(OSError, ValueError):
                send(connection, Stop(reason))

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self.listener.accept()
            except (OSError, EOFError):
                return  # closed: the run is over
            except Exception:  # noqa: BLE001 - a peer without the key: refused, the run goes on
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True,
                             name="anatomy-host").start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            try:
                hello = receive(connection, SILENT_SECONDS)
            except (EOFError, OSError, pickle.UnpicklingError):
                return
            if not isinstance(hello, Hello):
                return
            with self._lock:
                index = len(self.members) + 1
                name = hello.host if hello.host not in self.names else f"{hello.host}#{index + 1}"
                member = Member(index, name, tuple(hello.gpus),
                                hello.wall_at_start - wall_at(self.t0))
                self.members.append(member)
                self._connections[index] = connection
            try:
                send(connection, Welcome(self.run_id, index))
            except OSError:
                self._lose(member, "its connection closed as it joined")
                return
            self.on_join()
            self._follow(member, connection)
            with self._lock:
                self._connections.pop(index, None)

    def _follow(self, member: Member, connection: Connection) -> None:
        while True:
            try:
                message = receive(connection, SILENT_SECONDS)
            except (EOFError, OSError, pickle.UnpicklingError) as error:
                if member.left is None:
                    why = ("its connection closed" if isinstance(error, EOFError)
                           else f"its connection failed ({error})")
                    self._lose(member, why)
                return
            if message is None:
                self._lose(member, f"it was silent for {SILENT_SECONDS:.0f} s")
                return
            member.seen = time.monotonic()
            if isinstance(message, Forward):
                for item in message.messages:
                    self._pass_on(member, item)
            elif isinstance(message, Left):
                member.left = message
                return

    def _lose(self, member: Member, why: str) -> None:
        if member.lost is None and member.left is None:
            member.lost = f"{why} at {time.monotonic() - self.t0:.1f} s"
            self.on_lost(member)

    def _pass_on(self, member: Member, message) -> None:
        """One of a joining host's messages, moved onto the run's devices and clock, to the
        queue its kind goes on here (none once the recording has let its queues go)."""
        with contextlib.suppress(ValueError, OSError, AttributeError):
            self._put(member, message)

    def _put(self, member: Member, message) -> None:
        shift, index = member.shift, member.index
        match message:
            case protocol.Samples(samples=samples):
                self.samples.put(protocol.Samples(
                    [s._replace(t=s.t + shift, gpu=device_key(index, s.gpu)) for s in samples]))
            case protocol.SamplerDone(sent=sent):
                member.sent = sent  # the run's count is every host's (`samples_sent`)
            case protocol.DeviceStatus() | protocol.WorkerLeft():
                # Its device panel has no host of its own in the store yet, and its command's
                # exit is its own, not the run's.
                pass
            case protocol.Phase(mark=mark, source=source):
                self._place(member, source)
                self.events.put(protocol.Phase(mark._replace(t=mark.t + shift), source))
            case protocol.StepReport(step=step, source=source):
                self._place(member, source)
                self.events.put(protocol.StepReport(step._replace(t=step.t + shift), source))
            case protocol.Note(message=note, source=source):
                self.events.put(protocol.Note(note._replace(t=note.t + shift), source))
            case protocol.Failure(status=status, text=text, source=source):
                self.events.put(protocol.Failure(status, f"{member.name}: {text}", source))
            case _:
                self.events.put(message)

    def _place(self, member: Member, source: protocol.Source) -> None:
        rank = source.rank or 0
        if rank not in self.rank_places:
            local = source.device
            gpu = (member.gpus[min(local or 0, len(member.gpus) - 1)] if member.gpus else None)
            self.rank_places[rank] = (member.index, gpu)


class AllHosts:
    """The training as the run's recording follows it across hosts: this host's command, and
    the run ends once every joined host has said how its own ended (or was lost)."""

    def __init__(self, command, hosts: Hosts):
        self.command, self.hosts = command, hosts
        self.pid = command.pid

    def exit_code(self) -> int | None:
        code = self.command.exit_code()
        if code is None or not self.hosts.all_left():
            return None
        return code

    def end(self, grace: float) -> None:
        self.hosts.stop_all("the run was stopped on its host")
        self.command.end(grace)

    def end_left(self) -> None:
        self.command.end_left()


def places(ranks: dict[int, tuple[int, int | None]], names: Sequence[str]) -> RunFacts:
    """The run's facts for ranks on several hosts: each rank's host (its index among `names`) and
    GPU (NVML index on that host), rank by rank."""
    world = max(ranks) + 1
    facts = RunFacts.of(world_size=world, hosts=tuple(names),
                        rank_hosts=tuple(ranks.get(r, (0, None))[0] for r in range(world)))
    if any(gpu is not None for _, gpu in ranks.values()):
        facts = facts.merged(RunFacts.of(gpus=tuple(ranks.get(r, (0, 0))[1] or 0
                                                    for r in range(world))))
    return facts
