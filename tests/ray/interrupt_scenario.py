"""An interrupted sweep as a user's first one meets it, shared by ``test_interrupt_points.py`` and
``benchmarks/interrupt_resume.py`` (which repeats it).

One 2-trial sweep (a job of :mod:`tests.ray.interrupt_run`) is started by a driver
process, interrupted with SIGINT at several points, restored with ``Tuner.restore`` after
each, and run to its end. :func:`interrupted_sweep` does that and returns what it found;
:func:`resume_problems` lists every way the trials failed to resume exactly (an epoch
trained or reported twice or never, ``progress.csv`` with a repeated or missing epoch, a
launch that went back before the epochs already finished).

Also the small readers the Tune tests share: :func:`records`, :func:`csv_rows`,
:func:`run_driver`.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.exactly_once import assert_exactly_once
from tests.ray.conftest import REPO_ROOT
from tests.ray.interrupt_run import JOBS, NAME

INTERRUPTED_FILE = ".adaptdl-interrupted.tar"

# Where the sweep is interrupted: (event, epoch, delay after it, seconds). A report is
# followed by Tune's save of the trial's model.pt checkpoint (the case that lost the epoch);
# a pause is after a report, the trial held there by the harness until the signal is sent
# (so that the interrupt lands in it however loaded the machine); a batch is mid-epoch.
POINTS = (("report", 1, 0.0), ("pause", 4, 0.0), ("batch", 7, 0.0))
HOLD_FILE = "hold-from-epoch"  # beside the trials' record directories: see trial_jobs._held


def records(record_dir) -> list[dict]:
    """Every event a trial's replicas recorded, over all launches (``*.jsonl``). Safe to
    call while they train: a line still being written (no newline yet) is left out."""
    events = []
    for path in glob.glob(os.path.join(str(record_dir), "*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f if line.endswith("\n")]
    return events


def csv_rows(trial_path) -> list[dict]:
    """progress.csv read with the csv module; every row must be as wide as the header."""
    with open(os.path.join(trial_path, "progress.csv"), newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert all(len(r) == len(header) for r in body), \
        [(len(header), len(r)) for r in body if len(r) != len(header)]
    return [dict(zip(header, r)) for r in body]


def run_driver(*args) -> subprocess.Popen:
    """``python -m tests.ray.interrupt_run ARGS`` in the repository, output piped."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "tests.ray.interrupt_run", *args],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(records_root: Path, launch: int, point: tuple, driver: subprocess.Popen,
             timeout_s: float = 120) -> None:
    """Block until every trial still running started its ``launch``-th launch (0: the first
    run) and one of them reached ``point`` in it: ``("report", epoch)`` (reported that epoch
    or a later one), ``("held", epoch)`` (is held in the pause after such a report) or
    ``("batch", epoch)`` (trained a batch of it or a later one, i.e. is mid-epoch).

    Raises:
        AssertionError: not reached within ``timeout_s`` or the driver ended first."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and driver.poll() is None:
        trials = [records(d) for d in glob.glob(str(records_root / "*")) if os.path.isdir(d)]
        # A trial whose function already ended (on a loaded machine one may run ahead and
        # finish before an interrupt) has no further launch to wait for.
        running = [events for events in trials
                   if not any(e["event"] == "finished" for e in events)]
        started = bool(running) and all(
            any(e["event"] == "start" and e["restarts"] >= launch for e in events)
            for events in running)
        kind, epoch = point
        # In this launch or a later one, at this epoch or after it (a trial that was ahead
        # may have begun this launch past the point: it is still a report or mid-epoch).
        reached = any(any(e["event"] == kind and e.get("epoch", -1) >= epoch and
                          e.get("restarts", 0) >= launch for e in events)
                      for events in running)
        if len(trials) == 2 and started and reached:
            return
        time.sleep(0.05)
    raise AssertionError(f"the trials did not reach {point} (driver: {driver.poll()})")


def last_summary(out: str) -> dict:
    """The driver's last JSON line (Tune may print its own lines after it)."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"the driver printed no summary: {out[-4000:]}")


def interrupt(driver: subprocess.Popen, storage: Path, timeout_s: float = 120,
              release: Path | None = None) -> None:
    """SIGINT, then the driver must end on its own, leaving the saved state of each trial
    that had not finished (on a loaded machine a trial may be ahead and finish first: it
    has nothing to save, and its records must still show every epoch once). ``release``:
    a hold file removed once the signal is sent (the held trials go on from their pause).

    Raises:
        AssertionError: the driver failed, or an unfinished trial wrote no state."""
    before = {p: os.stat(p).st_mtime for p in glob.glob(
        str(storage / NAME / "*" / INTERRUPTED_FILE))}
    driver.send_signal(signal.SIGINT)
    if release is not None:
        release.unlink()
    out, _ = driver.communicate(timeout=timeout_s)
    assert driver.returncode == 0, out[-4000:]
    after = {p: os.stat(p).st_mtime for p in glob.glob(
        str(storage / NAME / "*" / INTERRUPTED_FILE))}
    fresh = [p for p, t in after.items() if before.get(p) != t]
    statuses = last_summary(out)["statuses"]
    unfinished = sum(status != "TERMINATED" for status in statuses)
    assert unfinished and len(fresh) == unfinished, (statuses, sorted(after), out[-4000:])


def resume_problems(summary: dict, epochs: int, size: int) -> list[str]:
    """Every way the restored sweep failed to resume exactly (empty: it did).

    Args:
        summary: the last restore's JSON summary (see :mod:`tests.ray.interrupt_run`).
        epochs, size: the job's epochs and training-set size."""
    problems, relaunched = [], False
    if summary["statuses"] != ["TERMINATED", "TERMINATED"]:
        problems.append(f"statuses {summary['statuses']}")
    want = [f"{e}:end" for e in range(epochs)]
    for trial in summary["trials"]:
        name = os.path.basename(trial["record_dir"])
        events = records(trial["record_dir"])
        try:
            assert_exactly_once(events, size, epochs)
        except AssertionError as exc:
            problems.append(f"trial {name}: trained {exc}")
        # Each epoch reported once by the function (records of all launches, any order).
        reported = sorted((e["key"] for e in events if e["event"] == "report"),
                          key=lambda k: int(k.split(":")[0]))
        if reported != want:
            problems.append(f"trial {name}: the function reported {reported}")
        keys = [r["report_key"] for r in csv_rows(trial["path"])]
        if keys != want:
            problems.append(f"trial {name}: progress.csv holds {keys}")
        # Each launch resumed after the epochs finished before it. (A driver run may see
        # no launch of a trial: one whose function had ended, its last reports still
        # queued in the trial when the interrupt saved it, only hands those over.)
        finished = launches(events)
        relaunched = relaunched or len(finished) >= 2
        if finished != sorted(finished) or finished[:1] != [0]:
            problems.append(f"trial {name}: launches began at finished epochs {finished}")
    # Every interrupt left a saved trial to resume (see interrupt()), so some trial ran in
    # more than one launch. Not necessarily each: under load a trial that is ahead can run
    # its last epochs while Tune handles the signal, and end in its first launch (seen in
    # CI, with the trials started together); its epochs are still checked above.
    if not relaunched:
        problems.append("no trial was relaunched: no interrupt left one to resume")
    return problems


def launches(events: list[dict]) -> list[int]:
    """The finished epochs each launch of a trial began at, in launch order."""
    starts = sorted((e for e in events if e["event"] == "start"), key=lambda e: e["restarts"])
    return [e["finished_epochs"] for e in starts]


def interrupted_sweep(root: Path, job: str = "validating", points=POINTS) -> dict:
    """Run the sweep ``job`` under ``root``, interrupt it at each of ``points`` (restoring
    after each), run the last restore to its end.

    Returns:
        ``{"problems": resume_problems(...), "seconds": wall time, "launches": for each
        trial (by record directory name), the finished epochs each launch began at}``.

    Raises:
        AssertionError: the harness could not carry the scenario out (a point not reached,
            a driver that failed, an interrupt that left no saved state)."""
    started = time.time()
    storage, records_root = root / "results", root / "records"
    config = JOBS[job][1]
    driver = run_driver("run", str(storage), str(records_root), job)
    try:
        for launch, (kind, epoch, delay) in enumerate(points):
            hold = None
            if kind == "pause":  # hold the trials after their report, until the signal
                hold = records_root / HOLD_FILE
                records_root.mkdir(parents=True, exist_ok=True)
                hold.write_text(str(epoch))
                kind = "held"
            wait_for(records_root, launch, (kind, epoch), driver)
            time.sleep(delay)
            interrupt(driver, storage, release=hold)
            driver = run_driver("restore", str(storage), str(records_root), job)
        out, _ = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, out[-4000:]
    summary = last_summary(out)
    return {"problems": resume_problems(summary, config["epochs"], config["size"]),
            "seconds": time.time() - started,
            "launches": {os.path.basename(t["record_dir"]): launches(records(t["record_dir"]))
                         for t in summary["trials"]}}
