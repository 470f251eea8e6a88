"""The phase API's arguments, refused before anything starts."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("rate", [0, 5000])
def test_the_phase_api_refuses_a_sample_rate_out_of_range(rate):
    import anatomy

    with pytest.raises(ValueError, match="sample_rate"):
        anatomy.start(sample_rate=rate)


@pytest.mark.parametrize("call", [
    lambda run: run.phase(None), lambda run: run.phase(""), lambda run: run.note(None),
    lambda run: run.note("ok", level=None)])
def test_a_mark_without_a_name_is_refused_at_the_call(call):
    """`run.phase(None)`, `run.note(None)` were taken: the store's NOT NULL refused them later
    and ended the recording of the whole run ("could not be written … the training went on
    unrecorded"). Refused where the script made the call, with what was wrong."""
    import time

    from anatomy.engine import attach

    run = attach.Run(attach._Unrecorded(), time.monotonic(), dwell=0.0)  # records nowhere
    with pytest.raises(ValueError, match="must be text, got"):
        call(run)
    run.phase("my own phase")  # any text names a phase of the user's
    run.note("a word", level="debug")


@pytest.mark.parametrize("kwargs, words", [
    ({"step": -5}, "step: must be a whole number from 0, got -5"),
    ({"total": -1}, "total: must be a whole number from 0, got -1"),
    ({"step": 2.5}, "step: must be a whole number from 0, got 2.5"),
    ({"loss": "abc"}, "loss: must be one number (loss.item()), got 'abc'"),
    ({"loss": [1.0, 2.0]}, "loss: must be one number (loss.item()), got [1.0, 2.0]"),
])
def test_a_step_that_no_import_would_take_is_refused_at_the_call(kwargs, words):
    """`run.step(step=-5)` was stored, and the run's export was then refused by every import
    ("steps[0].step: must be a whole number from 0"); a loss that is no number raised float()'s
    own words."""
    import time

    from anatomy.engine import attach

    run = attach.Run(attach._Unrecorded(), time.monotonic(), dwell=0.0)
    with pytest.raises(ValueError) as refused:
        run.step(**kwargs)
    assert str(refused.value) == words
    run.step(loss=0.5, step=0, total=0)  # a step 0 and an unknown length are the user's to say
