"""End-to-end test of examples/hyperopt_example.py in its --quick mode: a real HyperOpt
sweep of 3 AdaptDL trials under AdaptDLScheduler on a private local Ray instance.

It checks what a user relies on, reading the example's printed summary against Tune's own
progress.csv files (every row as wide as its header): the run succeeds; every trial
reported every epoch exactly once (also across the pauses and relaunches of resizes) and
the summary's epoch count is the number of epochs reported; the trial it names as best has
the highest final accuracy; its best checkpoint loads back and scores what the trial
reported with it; every relaunch is explained by a resize line.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("hyperopt")
pytest.importorskip("ray.tune")

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hyperopt_example.py"
BEST_RE = re.compile(r"^best trial: (\S+) mean_accuracy=([0-9.]+) ", re.MULTILINE)
LOADED_RE = re.compile(r"best checkpoint loaded back: test accuracy ([0-9.]+) "
                       r"\(reported with it: ([0-9.]+)\)")
QUICK_TRIALS, QUICK_EPOCHS = 3, 2


def progress_rows(storage: Path) -> dict[str, list[dict[str, str]]]:
    """Tune's progress.csv rows of every trial under ``storage``, by trial id."""
    rows = {}
    for path in storage.rglob("progress.csv"):
        with open(path, newline="") as f:
            raw = list(csv.reader(f))
        assert all(len(r) == len(raw[0]) for r in raw[1:]), path
        trial_rows = [dict(zip(raw[0], r)) for r in raw[1:]]
        if trial_rows:
            rows[trial_rows[0]["trial_id"]] = trial_rows
    return rows


def summary_table(stdout: str, trial_ids: set[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The example's per-trial table: its header's words and each trial's cells, by id."""
    lines = stdout.splitlines()
    header = next(line.split() for line in lines if line.split()[:2] == ["trial", "lr"])
    rows = {}
    for line in lines:
        cells = line.replace(" *", "").split()
        if cells and cells[0] in trial_ids:
            rows[cells[0]] = cells
    return header, rows


def test_quick_sweep(tmp_path):
    storage = tmp_path / "storage"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # The example starts (and stops) its own Ray; on a busy 2-core machine the whole run
    # takes one to two minutes, so the timeout is generous.
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--verbose", "0",
         "--storage-path", str(storage)],
        env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert " failed: " not in result.stdout, output

    # Tune's progress.csv of each trial holds every epoch exactly once, in order (a final
    # row Tune adds when the trial ends may repeat the last one).
    rows = progress_rows(storage)
    assert len(rows) == QUICK_TRIALS, (sorted(rows), output)
    for trial_id, trial_rows in rows.items():
        epochs = [int(r["epoch"]) for r in trial_rows]
        if len(epochs) > QUICK_EPOCHS and epochs[-1] == epochs[-2]:
            epochs.pop()
        assert epochs == list(range(QUICK_EPOCHS)), (trial_id, epochs)
        assert "adaptdl/hints" not in trial_rows[0]  # hints travel beside the results

    # The summary's line per trial: its epoch count is the epochs the trial reported (the
    # progress table's "epochs" column, Tune's iteration count), its accuracy the last one.
    header, table = summary_table(result.stdout, set(rows))
    assert set(table) == set(rows), output
    epochs_col, accuracy_col = header.index("epochs"), header.index("accuracy")
    for trial_id, cells in table.items():
        assert int(cells[epochs_col]) == QUICK_EPOCHS, (trial_id, output)
        assert int(rows[trial_id][-1]["training_iteration"]) == QUICK_EPOCHS
        assert float(cells[accuracy_col]) == pytest.approx(
            float(rows[trial_id][-1]["mean_accuracy"]), abs=1e-4)

    # The best trial printed has the highest final accuracy.
    printed = BEST_RE.findall(result.stdout)
    assert len(printed) == 1, output
    best_id, best_acc = printed[0]
    finals = {t: float(r[-1]["mean_accuracy"]) for t, r in rows.items()}
    assert finals[best_id] == max(finals.values()), (finals, output)
    assert float(best_acc) == pytest.approx(finals[best_id], abs=1e-4)
    # Its best checkpoint, loaded back in the driver, scores what the trial reported with
    # it, which is its best reported accuracy.
    loaded = LOADED_RE.search(result.stdout)
    assert loaded, output
    assert loaded.group(1) == loaded.group(2), output
    best_reported = max(float(r["mean_accuracy"]) for r in rows[best_id])
    assert float(loaded.group(2)) == pytest.approx(best_reported, abs=1e-4)

    # Every relaunch of a trial (no trial failed) is a resize, printed with its reason,
    # predicted and measured cost.
    for trial_id, trial_rows in rows.items():
        relaunches = max(int(r["adaptdl/restarts"]) for r in trial_rows)
        explained = re.findall(rf"^trial {trial_id} resized \d+ -> \d+ replicas \(.+\); "
                               r"predicted saving .*, measured cost ", result.stdout, re.M)
        assert len(explained) >= relaunches, (trial_id, output)
