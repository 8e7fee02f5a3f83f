"""Ctrl-C, then ``Tuner.restore``, must resume exactly where the
run stopped, whatever the trials were doing when the signal came.

The sweep is the one that broke it: two trials on 4 logical CPUs, each short epoch trains
with ``autoscale_batch_size``, runs a validation loop over a second
``AdaptiveDataLoader``, reports a ``model.pt`` checkpoint (so Tune saves the trial after
every report). One experiment is interrupted three times, each time at another point, and
restored after each: right at a report (a trial inside Tune's save of that checkpoint: the
case that lost the epoch), in the pause after a report (the trials held there until the
signal is sent) and in the middle of an epoch's training. Across
all of it, every epoch is trained and reported exactly once, and each interrupt left the
trials' saved state in their directories (:mod:`tests.ray.interrupt_scenario`;
``benchmarks/interrupt_resume.py`` repeats it and counts the runs that resumed exactly).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from tests.ray.interrupt_scenario import POINTS, interrupted_sweep  # noqa: E402

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow


# Each restore starts Ray and Tune again (most of the test's time), so one sweep takes all
# three points: right at a report, held in the pause after a report (until the signal is
# sent: see interrupt_scenario.POINTS), mid-epoch. benchmarks/interrupt_resume.py repeats
# the scenario, with and without a real pause after each report.
def test_interrupts_at_a_report_in_the_pause_and_mid_epoch_each_resume_exactly(tmp_path):
    result = interrupted_sweep(tmp_path, "validating-nopause", POINTS)
    assert result["problems"] == []
