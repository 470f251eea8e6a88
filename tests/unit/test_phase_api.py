"""The phase API's arguments, refused before anything starts."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("rate", [0, 5000])
def test_the_phase_api_refuses_a_sample_rate_out_of_range(rate):
    import anatomy

    with pytest.raises(ValueError, match="sample_rate"):
        anatomy.start(sample_rate=rate)
