"""`anatomy watch --join HOST:PORT -- COMMAND` on a host other than the run's: the
command and a sampler here, everything they say forwarded to the run's host over the link of
engine/hosts.py, where it is one more source of the run's one recording."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client, Connection
from typing import TextIO

from anatomy.engine import link
from anatomy.engine.endings import exit_status
from anatomy.engine.hosts import (
    BEAT_SECONDS,
    CONNECT_SECONDS,
    FORWARD_SECONDS,
    JOIN_KEY_ENV,
    OUTBOX_MESSAGES,
    SILENT_SECONDS,
    Beat,
    Forward,
    Hello,
    JoinAddress,
    JoinRefused,
    Left,
    Stop,
    Welcome,
    receive,
    send,
    wall_at,
)
from anatomy.engine.locks import DeviceBusy, gpu_key, take_all
from anatomy.engine.recording import TAIL_SECONDS, heard_signals, spawn_sampler
from anatomy.engine.watch import STOP_GRACE_SECONDS, Watch, _Command, _say


class Joined:
    """`anatomy watch --join HOST:PORT -- COMMAND` on a host other than the run's: the command and
    a sampler here, everything they say forwarded to the run's host. Its exit status is the
    command's (128 + N for a signal), or 128 + N for the signal that stopped this watch."""

    def __init__(self, watch: Watch, address: JoinAddress, key: bytes):
        self.watch, self.address, self.key = watch, address, key
        self.context = mp.get_context("spawn")
        self.t0 = time.monotonic()
        self.run_id: int | None = None
        self.index: int | None = None
        self.events: queue_module.Queue = queue_module.Queue()  # the ranks' messages
        self.samples = self.context.Queue()
        self.stop_sampler = self.context.Event()
        self.heard = heard_signals(self.context)  # the stop signals the sampler got
        self.sampling = threading.Event()
        # Set once nothing is forwarded any more: the ranks' socket (Watch._receive) then drops
        # their messages, as it does once a recording has ended, rather than queue them unread.
        self.done = threading.Event()
        self.connection: Connection | None = None
        self.gone: str | None = None  # the run's host is gone: why
        self.stop_asked: str | None = None  # the run's host asked the command to end
        self.sent_last = time.monotonic()

    def connect(self) -> None:
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                self.connection = Client((self.address.host, self.address.port),
                                         family="AF_INET", authkey=self.key)
                break
            except mp.AuthenticationError:
                raise JoinRefused(f"--join {self.address}: the run's host refused this host's "
                                  f"key ({JOIN_KEY_ENV} differs)") from None
            except OSError as error:  # refused, unreachable, a name not known: not there yet
                if time.monotonic() > deadline:
                    raise JoinRefused(f"--join {self.address}: no run's host answered within "
                                      f"{CONNECT_SECONDS:.0f} s ({error})") from None
                time.sleep(0.5)
        devices = self.watch.devices
        send(self.connection, Hello(socket.gethostname(), tuple(d.nvml_index for d in devices),
                                    self.watch.info.backend, wall_at(self.t0)))
        welcome = receive(self.connection, SILENT_SECONDS)
        if not isinstance(welcome, Welcome):
            raise JoinRefused(f"--join {self.address}: the run's host did not answer")
        self.run_id, self.index = welcome.run_id, welcome.index

    def run(self, out: TextIO = sys.stderr) -> int:
        """Join, run the command to its end, forward all along; the exit status to give back.
        Ctrl-C, SIGTERM and SIGHUP stop the command (as a watch's do), and the run's host is
        told how it ended."""
        with self.watch._signals_as_flags():
            return self._run(out)

    def request_stop(self, reason: str) -> None:
        """A stop signal reached this watch (`Watch._signals_as_flags`): the loop passes it on."""

    def _run(self, out: TextIO) -> int:
        watch, devices = self.watch, self.watch.devices
        self.connect()
        watch.recording = self  # what its ranks' socket reads: the run, sampled once, the queue
        words = {gpu_key(d.nvml_index): f"GPU {d.index}" for d in devices}
        try:
            locks = take_all(list(words), f"a watch (pid {os.getpid()}) joined to run "
                             f"{self.run_id} on {self.address.host}", words.get)
        except DeviceBusy as error:
            raise JoinRefused(str(error)) from None
        fds = tuple(lock.fileno() for lock in locks)
        training_pid = self.context.Value("i", 0)
        sampling, outbox = spawn_sampler(self.context, self.samples, self.stop_sampler,
                                         watch.info.backend, watch.sample_rate, self.t0,
                                         [d.nvml_index for d in devices], training_pid, fds,
                                         self.heard)
        self.sampling.set()
        listener, address, key = watch._listen()
        env = {**os.environ, link.WATCH_ENV: address, link.WATCH_KEY_ENV: key,
               link.T0_ENV: repr(self.t0), "PYTHONUNBUFFERED": "1"}
        try:
            child = subprocess.Popen(watch.command, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, pass_fds=fds)
        except OSError as error:
            self.stop_sampler.set()
            listener.close()
            for held in locks:
                held.release()
            raise JoinRefused(f"cannot run {watch.command[0]!r}: {error.strerror or error}"
                              ) from None
        command = _Command(child)
        training_pid.value = child.pid
        _say(f"run {self.run_id} on {self.address.host}: this host joined it (host "
             f"{self.index}); watching {' '.join(watch.command)} (pid {child.pid}) on "
             f"{', '.join(d.name for d in devices) or 'the CPU (RSS)'}", out)
        tees = [threading.Thread(target=watch.output.tee, args=(stream, target), daemon=True)
                for stream, target in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))]
        for tee in tees:
            tee.start()
        threading.Thread(target=self._hear, daemon=True, name="anatomy-join-hear").start()
        ended_at = None
        stop_sent = False
        while True:
            self._gather(outbox)
            self._forward(outbox)
            code = command.exit_code()
            asked = watch.asked[0] if watch.asked else None
            if code is None and not stop_sent and (asked is not None or self.stop_asked):
                stop_sent = True
                reason = self.stop_asked or signal.Signals(asked).name
                _say(f"anatomy: stopping the command ({reason})…", out)
                if asked is None or not watch.reached(command, asked):
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signal.SIGTERM if asked is None else asked)
                threading.Thread(target=command.end, args=(STOP_GRACE_SECONDS,),
                                 daemon=True).start()
            if code is not None and ended_at is None:
                ended_at = time.monotonic()
            if ended_at is not None and time.monotonic() - ended_at >= TAIL_SECONDS:
                break
            time.sleep(FORWARD_SECONDS / 2)
        self.stop_sampler.set()
        sampling.join(5)
        if sampling.is_alive():
            sampling.kill()
        self._gather(outbox)
        self._forward(outbox, force=True)
        self.done.set()
        why = (f"stopped on its host ({self.stop_asked or signal.Signals(watch.asked[0]).name})"
               if stop_sent else None)
        if self.connection is not None and self.gone is None:
            with contextlib.suppress(OSError, ValueError):
                send(self.connection, Left(child.returncode, why))
                self.connection.close()
        command.end_left()
        for tee in tees:
            tee.join(timeout=5)
        listener.close()
        for held in locks:
            held.release()
        self.samples.close()
        if self.gone is not None:
            _say(f"anatomy: run {self.run_id}: the run's host is gone ({self.gone}); what this "
                 "host measured after that is not recorded", out)
        if watch.asked:
            return 128 + watch.asked[0]
        return exit_status(child.returncode)

    def _gather(self, outbox: list) -> None:
        for source in (self.samples, self.events):
            while len(outbox) < OUTBOX_MESSAGES:
                try:
                    outbox.append(source.get_nowait())
                except (queue_module.Empty, OSError, ValueError):
                    break

    def _forward(self, outbox: list, force: bool = False) -> None:
        if self.gone is not None or self.connection is None:
            outbox.clear()
            return
        due = force or time.monotonic() - self.sent_last >= FORWARD_SECONDS
        try:
            if outbox and due:
                send(self.connection, Forward(list(outbox)))
                outbox.clear()
                self.sent_last = time.monotonic()
            elif time.monotonic() - self.sent_last >= BEAT_SECONDS:
                send(self.connection, Beat())
                self.sent_last = time.monotonic()
        except (OSError, ValueError) as error:
            self.gone = f"the connection to {self.address} failed: {error}"
            outbox.clear()

    def _hear(self) -> None:
        """What the run's host says: a stop. Its silence past SILENT_SECONDS, or a closed
        connection, means it is gone: this host's measurements go nowhere from then on."""
        while self.gone is None:
            try:
                message = receive(self.connection, SILENT_SECONDS * 10)
            except (EOFError, OSError, ValueError):
                if self.gone is None and not self.connection.closed:
                    self.gone = "its connection closed"
                return
            if isinstance(message, Stop):
                self.stop_asked = message.reason
