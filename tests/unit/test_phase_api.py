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
