"""End-to-end test of examples/hyperopt_example.py in its --quick mode: a real HyperOpt
sweep of 3 AdaptDL trials under AdaptDLScheduler on a private local Ray instance.

It checks what a user relies on: the run succeeds, the trial it names as best is the one
with the highest final accuracy, its best checkpoint loads back and scores what the trial
reported with it, every resize is explained, and every trial reported every epoch exactly
once (also across the pauses and relaunches of resizes), read both from the example's JSON
summary and, independently, from Tune's own progress.csv files (every row as wide as its
header).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("hyperopt")
pytest.importorskip("ray.tune")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hyperopt_example.py"
BEST_RE = re.compile(r"^best trial: (\S+) mean_accuracy=([0-9.]+) ", re.MULTILINE)
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


def test_quick_sweep(tmp_path):
    storage, summary_path = tmp_path / "storage", tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # The example starts (and stops) its own Ray; on a busy 2-core machine the whole run
    # takes one to two minutes, so the timeout is generous.
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--verbose", "0",
         "--storage-path", str(storage), "--summary-json", str(summary_path)],
        env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output

    summary = json.loads(summary_path.read_text())
    trials = summary["trials"]
    assert len(trials) == QUICK_TRIALS, output
    assert summary["errors"] == 0, output
    for t in trials:
        assert t["error"] is None, t
        assert t["epochs"] == list(range(QUICK_EPOCHS)), t
        assert len(t["replicas"]) == QUICK_EPOCHS and all(r >= 1 for r in t["replicas"]), t
        assert 0.0 <= t["final_accuracy"] <= 1.0, t
    configs = {t["trial_id"]: t["config"] for t in trials}

    # The best trial printed (and in the JSON) has the highest final accuracy.
    printed = BEST_RE.findall(result.stdout)
    assert len(printed) == 1, output
    best_id, best_acc = printed[0]
    top = max(t["final_accuracy"] for t in trials)
    assert summary["best"]["trial_id"] == best_id, output
    assert abs(float(best_acc) - top) < 1e-4, output
    assert next(t for t in trials if t["trial_id"] == best_id)["final_accuracy"] == top
    # The best trial's best checkpoint, loaded back in the driver, scores what the trial
    # reported with it.
    loaded = summary["best_checkpoint"]
    assert loaded is not None, output
    assert loaded["accuracy_now"] == pytest.approx(loaded["accuracy_reported"], abs=1e-9)
    assert re.search(r"best checkpoint loaded back: test accuracy", result.stdout), output
    # Every resize is printed with its reason.
    resizes = [r for t in trials for r in t["resizes"]]
    assert summary["resizes"] == len(resizes)
    assert len(re.findall(r"replicas: .*measured cost", result.stdout)) == len(resizes)

    # Independently of the example's own parsing: Tune's progress.csv of each trial holds
    # every epoch exactly once, in order (a final row Tune adds when the trial ends may
    # repeat the last one), and its last accuracy is the one the summary reports.
    rows = progress_rows(storage)
    assert set(rows) == set(configs), (sorted(rows), sorted(configs))
    for trial_id, trial_rows in rows.items():
        epochs = [int(r["epoch"]) for r in trial_rows]
        if len(epochs) > QUICK_EPOCHS and epochs[-1] == epochs[-2]:
            epochs.pop()
        assert epochs == list(range(QUICK_EPOCHS)), (trial_id, epochs)
        summary_acc = next(t for t in trials if t["trial_id"] == trial_id)["final_accuracy"]
        assert float(trial_rows[-1]["mean_accuracy"]) == pytest.approx(summary_acc)
        assert "adaptdl/hints" not in trial_rows[0]  # hints travel beside the results
