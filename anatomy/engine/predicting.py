"""The predicted peak of a training, worked out beside it: a child interpreter reads the run's
facts from its store (the model's config, the options, the sequence length the Trainer callback
described at the first step), predicts as the Anatomy page does (prediction/breakdown.py), and
says the peak in one line; the front (a user's Trainer callback, `anatomy run --metrics-port`)
hands it to the run's figures, so that its logs and /metrics carry `anatomy/predicted_peak_mib`
once it is known.

Why a child: the prediction traces a training step on fake tensors (seconds of CPU, torch's
dispatch modes); in the user's process it would hold the GIL against the training and share
torch's global state with it. So the child runs at the lowest priority, sees no GPU (a
prediction never needs one: CUDA_VISIBLE_DEVICES is emptied), and leaves the training's process
tree as it starts (a second fork: on a CPU the sampler measures that tree's RSS). It ends when
it has answered, when the training's process is gone, or when the training ends first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

T = TypeVar("T")

FACTS_WAIT_SECONDS = 120.0  # the run's facts reaching its store, at most
POLL_SECONDS = 0.5


class Answer(NamedTuple):
    """What the child said: the peak in bytes (on the axis of the run's samples: NVML's figure
    on a GPU, the RSS on a CPU), or why there is none, in words that follow "no predicted peak: "."""

    peak: int | None
    why: str | None = None


class Predicting:
    """The prediction of run `run_id` of the store `locator` (Store.locator()), under way in a
    child; `answered` is called once, in a thread of its own, with its answer (never after
    `end()`). `seq_len`: the sequence length described at the first step, which the stored
    options must show before the prediction is made (None: none to wait for)."""

    def __init__(self, locator: str, run_id: int, seq_len: int | None,
                 answered: Callable[[Answer], None]):
        self.answered = answered
        self.child: subprocess.Popen | None = None
        self._pid: int | None = None  # the child's, once it has left the training's tree
        self._ended = False
        self._lock = threading.Lock()
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", __name__, locator, str(run_id), str(os.getpid()),
                 str(seq_len or 0)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True, text=True,
                env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        except OSError as error:
            answered(Answer(None, f"its process did not start ({error.strerror or error})"))
            return
        threading.Thread(target=self._read, name="anatomy-predicted-peak", daemon=True).start()

    def _read(self) -> None:
        child = self.child
        child.wait()  # the first fork: it has left once the child is out of the tree
        with child.stdout:
            pid = _pid_of(child.stdout.readline())
            with self._lock:
                self._pid = pid
                ended = self._ended
            if ended:
                self._kill()
                return
            line = child.stdout.readline()
        with self._lock:
            if self._ended:
                return
            self._ended = True  # answered: nothing left to end
        self.answered(_answer_of(line))

    def end(self) -> None:
        """The training is over: a child still predicting ends (no process outlives its run),
        and its answer, if it comes, is not taken."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._kill()

    def _kill(self) -> None:
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGTERM)
            except OSError:
                pass  # it has answered and gone meanwhile


def _pid_of(line: str) -> int | None:
    try:
        pid = json.loads(line).get("pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _answer_of(line: str) -> Answer:
    """The child's answer line as an Answer; one that is no answer (it died) says so."""
    try:
        said = json.loads(line)
        peak, why = said.get("peak"), said.get("why")
    except (ValueError, AttributeError):
        return Answer(None, "its process ended without an answer")
    if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0:
        return Answer(peak)
    return Answer(None, why if isinstance(why, str) else "its process gave no peak")


# --- the child ---
def _leave_tree() -> None:
    """Out of the training's process tree: this process forks and ends; the fork goes on,
    under no process of the training's (its parent, reaped, is gone)."""
    if os.fork():
        os._exit(0)


def _follow_parent(parent: int) -> None:
    """End with the training's process (a thread: the prediction itself blocks)."""
    def watch() -> None:
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(0)
            except OSError:
                pass  # another user's pid now would be "not permitted": alive, as far as known
            time.sleep(POLL_SECONDS)

    threading.Thread(target=watch, daemon=True).start()


def predict(locator: str, run_id: int, seq_len: int) -> Answer:
    """The run's predicted peak, once its store holds what the prediction stands on: the
    model's config, the sequence length described at the first step, and on a CPU its weights
    phase's memory (the RSS prediction is on top of it)."""
    from anatomy.analysis.report import report
    from anatomy.prediction import breakdown
    from anatomy.store import Store
    from anatomy.vocabulary import Phase

    # never made again where it went away meanwhile
    store, away = _reachable(lambda: Store(locator, read_only=True))
    deadline = time.monotonic() + FACTS_WAIT_SECONDS + away
    while True:
        rep, away = _reachable(lambda: store.run(run_id) and report(store, run_id))
        deadline += away  # the facts' wait counts while the store answers
        if rep is None:  # deleted meanwhile, or a store that is not the run's
            return Answer(None, f"run {run_id} is not in the store {store.path}")
        # A run of anatomy's own names its model in its options (a preset, a file it keeps);
        # a user's training, by the config its callback stored.
        model = rep.started_by_anatomy or rep.environment.model_config is not None
        known = model and (not seq_len or (rep.options.seq_len or 0) >= seq_len) and \
            (rep.on_gpu or rep.phase_memory()[Phase.WEIGHTS] is not None)
        if known:
            break
        if time.monotonic() > deadline:
            return Answer(None, f"the run's model and options did not reach its store within "
                                f"{FACTS_WAIT_SECONDS:.0f} s")
        time.sleep(POLL_SECONDS)
    found = breakdown.predicted(rep)
    if isinstance(found, breakdown.NoPrediction):
        return Answer(None, found.reason)
    peak = breakdown.peak_on_axis(rep, found)
    return Answer(peak) if peak is not None else Answer(None, "the run has no peak to stand on")


def _reachable(read: Callable[[], T]) -> tuple[T, float]:
    """`read()`, and the seconds its store's database server was waited for: one that cannot be
    reached now is waited for, as the recording waits for it (this process ends with the
    training's); any other error is raised."""
    from anatomy.store import DatabaseError, StoreError, unreachable

    away = 0.0
    while True:
        try:
            return read(), away
        except StoreError as error:
            if not error.unreachable:
                raise
        except DatabaseError as error:
            if not unreachable(error):
                raise
        time.sleep(POLL_SECONDS)
        away += POLL_SECONDS


def main(argv: list[str]) -> int:
    _leave_tree()
    locator, run_id, parent, seq_len = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    os.nice(19)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    _follow_parent(parent)
    from anatomy.store import StoreError

    try:
        answer = predict(locator, run_id, seq_len)
    except StoreError as error:  # gone meanwhile, or a database server that went away
        answer = Answer(None, f"the store {error}")
    except Exception as error:  # noqa: BLE001 - said in the answer's line, never a traceback
        answer = Answer(None, f"{type(error).__name__}: {error}")
    print(json.dumps(answer._asdict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
