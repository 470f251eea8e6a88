"""The tests' own wait (tests/helpers.py): what every test that waits on a process leans on."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.helpers import one_line, wait_until, within


class _Ended:
    """A process, as wait_until reads one, that ended with code 3 after printing."""

    args = ["python", "train.py"]
    returncode = 3

    def poll(self) -> int:
        return self.returncode

    def communicate(self, timeout: float) -> tuple[str, str]:
        return "", "Traceback: the loss went NaN\n"


def test_a_wait_returns_the_conditions_first_true_value():
    asked = itertools.count(1)
    assert wait_until(lambda: [n] if (n := next(asked)) >= 3 else [], 10, "a third ask",
                      every=0) == [3]


def test_a_wait_that_times_out_says_what_it_awaited_and_what_it_saw():
    with pytest.raises(AssertionError, match=r"waited for the run's step 2: not within 0.2 s\n"
                                             r"seen: 1 step"):
        wait_until(lambda: False, 0.2, "the run's step 2", seen=lambda: "1 step")


def test_a_wait_on_a_process_that_ended_fails_at_once_with_its_output():
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: False, 60, "the run's step 2", process=_Ended())
    assert time.monotonic() - started < 30  # not the 60 s: a hang, not a speed
    assert str(failed.value) == ("waited for the run's step 2: python train.py ended with code 3"
                                 " first:\nTraceback: the loss went NaN\n")


def test_within_gives_the_last_false_value_at_its_deadline():
    assert within(0.1, lambda: [], every=0.01) == []


def test_one_line_refuses_a_traceback_and_a_second_line():
    assert one_line("error: no such run\n") == "error: no such run\n"
    for err in ("error: a\nerror: b\n", "Traceback (most recent call last):\n", "no such run\n"):
        with pytest.raises(AssertionError):
            one_line(err)
