"""Ctrl-C, then ``Tuner.restore``, must resume exactly where the
run stopped, whatever the trials were doing when the signal came.

The sweep is the one that broke it: two trials on 4 logical CPUs, each short epoch trains
with ``autoscale_batch_size``, runs a validation loop over a second
``AdaptiveDataLoader``, reports a ``model.pt`` checkpoint (so Tune saves the trial after
every report) and, in one variant, sleeps 0.5 s. One experiment is interrupted several
times, each time at another point, and restored after each: right at a report (a trial
inside Tune's save of that checkpoint: the case that lost the epoch), 0.25 s after a report
(inside the pause of the variant that has one) and in the middle of an epoch's training
(in the variant without). Across
all of it, every epoch is trained and reported exactly once, and each interrupt left the
trials' saved state in their directories (:mod:`tests.ray.interrupt_scenario`;
``benchmarks/interrupt_resume.py`` repeats it and counts the runs that resumed exactly).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from tests.ray.interrupt_scenario import interrupted_sweep  # noqa: E402

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow


# Each restore starts Ray and Tune again (most of the test's time), so each variant takes
# the points that matter to it: right at a report in both; 0.25 s after one where it falls
# in the pause; mid-epoch where there is no pause. benchmarks/interrupt_resume.py runs all
# three points on either variant, repeatedly.
@pytest.mark.parametrize("job,points", [
    ("validating", (("report", 1, 0.0), ("report", 4, 0.25))),
    ("validating-nopause", (("report", 1, 0.0), ("batch", 4, 0.0))),
])
def test_interrupts_at_a_report_in_the_pause_and_mid_epoch_each_resume_exactly(tmp_path, job,
                                                                               points):
    result = interrupted_sweep(tmp_path, job, points)
    assert result["problems"] == []
