"""Issue 25's headline bug: Ctrl-C, then ``Tuner.restore``, must resume exactly where the
run stopped, whatever the trials were doing when the signal came.

The sweep is the one that broke it: two trials on 4 logical CPUs, each short epoch trains
with ``autoscale_batch_size``, runs a validation loop over a second
``AdaptiveDataLoader``, reports a ``model.pt`` checkpoint (so Tune saves the trial after
every report) and sleeps 0.5 s. One experiment is interrupted several times, each time at
another point, and restored after each: right at a report (a trial inside Tune's save of
that checkpoint: the case that lost the epoch), inside the pause after a report, and in
the middle of an epoch's training. Across all of it, every epoch is trained and reported
exactly once, and each interrupt left the trials' saved state in their directories.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import pytest

pytest.importorskip("ray")

from tests.exactly_once import assert_exactly_once  # noqa: E402
from tests.ray.interrupt_run import JOBS, NAME  # noqa: E402
from tests.ray.test_tune_contracts import csv_rows, records, run_driver  # noqa: E402

INTERRUPTED_FILE = ".adaptdl-interrupted.tar"


def _wait_for(records_root, launch, point, driver, timeout_s=120):
    """Block until both trials started their ``launch``-th launch (0: the first run) and
    one of them reached ``point`` in it: ``("report", epoch)`` (reported that epoch) or
    ``("batch", epoch)`` (trained a batch of it, i.e. is mid-epoch)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and driver.poll() is None:
        trials = [records(d) for d in glob.glob(str(records_root / "*"))]
        started = all(any(e["event"] == "start" and e["restarts"] >= launch for e in events)
                      for events in trials)
        kind, epoch = point
        reached = any(any(e["event"] == kind and e.get("epoch", e.get("key")) in
                          (epoch, f"{epoch}:end") for e in events) for events in trials)
        if len(trials) == 2 and started and reached:
            return
        time.sleep(0.05)
    raise AssertionError(f"the trials did not reach {point} (driver: {driver.poll()})")


def _interrupt(driver, storage):
    """SIGINT, then the driver must end on its own, leaving each trial's saved state."""
    before = {p: os.stat(p).st_mtime for p in glob.glob(
        str(storage / NAME / "*" / INTERRUPTED_FILE))}
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, out[-4000:]
    after = {p: os.stat(p).st_mtime for p in glob.glob(
        str(storage / NAME / "*" / INTERRUPTED_FILE))}
    fresh = [p for p, t in after.items() if before.get(p) != t]
    assert len(fresh) == 2, (sorted(after), out[-4000:])


def test_interrupts_at_a_report_in_the_pause_and_mid_epoch_each_resume_exactly(tmp_path):
    storage, records_root = tmp_path / "results", tmp_path / "records"
    job = "validating"
    config = JOBS[job][1]
    points = [("report", 1, 0.0),    # a trial inside Tune's save of its checkpoint
              ("report", 4, 0.25),   # inside the 0.5 s pause after the report
              ("batch", 7, 0.0)]     # training, mid-epoch
    driver = run_driver("run", str(storage), str(records_root), job)
    for launch, (*point, delay) in enumerate(points):
        _wait_for(records_root, launch, tuple(point), driver)
        time.sleep(delay)
        _interrupt(driver, storage)
        driver = run_driver("restore", str(storage), str(records_root), job)
    out, _ = driver.communicate(timeout=240)
    assert driver.returncode == 0, out[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["statuses"] == ["TERMINATED", "TERMINATED"]
    epochs = config["epochs"]
    for trial in summary["trials"]:
        events = records(trial["record_dir"])
        assert_exactly_once(events, config["size"], epochs)
        # Each epoch reported once by the function (records of all launches, any order).
        reported = sorted((e["key"] for e in events if e["event"] == "report"),
                          key=lambda k: int(k.split(":")[0]))
        assert reported == [f"{e}:end" for e in range(epochs)], reported
        rows = csv_rows(trial["path"])
        assert [r["report_key"] for r in rows] == [f"{e}:end" for e in range(epochs)]
        # One launch per driver run, each restore resuming after the epochs finished
        # before its interrupt.
        starts = sorted((e for e in events if e["event"] == "start"),
                        key=lambda e: e["restarts"])
        assert len(starts) >= 1 + len(points)
        finished = [e["finished_epochs"] for e in starts]
        assert finished == sorted(finished) and finished[0] == 0 and finished[-1] >= 3, finished
