"""What a lost node costs a submitted job and a Tune trial, and how fast a Tune trial leaves
a draining node, over repeated runs.

* **lost**: the scenario of ``tests/ray/test_lost_nodes.py``
  (``tests/ray/lost_node_job_run.py``): a two-node ``ray.cluster_utils.Cluster`` of its
  own (a head of 1 CPU, a worker of 2), a 2-replica job (``tests/core/jobs/elastic_job.py``
  under ``ElasticJob``, 0.2 s per batch) checkpointing in place every ``--interval``
  seconds; after 30 batches the worker is removed without notice. Measured: from the
  removal to the first step on the head, the samples trained twice (the work since the
  newest checkpoint) against one interval's worth, and the seconds each in-place
  checkpoint held the driver (fetching and storing it included); the share of time those
  saves would take at the default interval is their mean over
  ``DEFAULT_CHECKPOINT_INTERVAL_S``.
* **trial-lost**: the scenario of ``tests/ray/test_lost_nodes.py``'s trial test
  (``tests/ray/lost_node_trial_run.py``): a 3-replica Tune trial under
  ``AdaptDLScheduler``, one replica on the worker (a head of 3 CPUs, a worker of 1),
  checkpointing in place every ``--interval`` seconds; after 30 steps the worker is removed
  without notice. Measured: from the removal to the first step of the relaunch in the same
  placement group, the samples trained twice against one interval's worth, and the
  failures Tune counted.
* **trial-actor**: a one-replica trial (its replica runs in the trial actor) on the worker
  (the head's one CPU held until the loss), checkpointing in place every ``--interval``
  seconds, each checkpoint also kept on the run's storage; after 30 steps the worker is
  removed without notice: Tune counts a failure and retries (``max_failures=1``) on the
  head, from the kept checkpoint (``lost_node_trial_run.py ... actor``). Measured: from the
  removal to the first step of the retry, the samples trained twice against one
  interval's worth.
* **trial-drain**: the scenario of ``tests/ray/test_draining_nodes.py``'s trial test
  (``tests/ray/drain_trial_run.py``): a 2-replica Tune trial under ``AdaptDLScheduler``
  on the worker, drained with a 60 s deadline. Measured: from ``ray drain-node``
  returning to the first step of the relaunch on the head, and exactly-once training.

    python benchmarks/node_loss.py --runs 5
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, machine_description  # noqa: F401  (puts the repository on sys.path)
from adaptdl_ray.cluster.elastic_job import DEFAULT_CHECKPOINT_INTERVAL_S  # noqa: E402
from tests.exactly_once import assert_exactly_once, samples_per_epoch  # noqa: E402
from tests.ray.two_nodes import summary_of  # noqa: E402


def _run(module: str, *args: str) -> tuple[dict | None, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None, proc.stderr[-2000:]
    return summary_of(proc.stdout), ""


def _loss_run(module: str, interval_s: float, ok: Any, *extra: str) -> dict:
    """One scenario ``module`` (tests/ray/lost_node_*_run.py) whose worker node is removed
    without notice, in its own process (own cluster): its summary, whether every sample
    was trained, the samples trained twice and one interval's worth; ``ok(summary)`` says
    whether it recovered."""
    from tests.ray.interrupt_scenario import records
    scenario = importlib.import_module(module)
    with tempfile.TemporaryDirectory(prefix="node-loss-") as d:
        record = Path(d) / "record"
        record.mkdir()
        seen, problem = _run(module, str(Path(d) / "storage"), str(record), str(interval_s),
                             *extra)
        if seen is None:
            return {"ok": False, "problem": problem}
        per_epoch = samples_per_epoch(records(record))
    complete = all(set(c) == set(range(scenario.SIZE)) for c in per_epoch.values())
    repeated = sum(n - 1 for c in per_epoch.values() for n in c.values())
    return {"ok": bool(ok(seen)), "complete": complete, "repeated": repeated,
            "interval_samples": interval_s / scenario.SLEEP_S * scenario.BATCH, **seen}


def lost_run(interval_s: float) -> dict:
    """One job whose node is removed without notice."""
    return _loss_run("tests.ray.lost_node_job_run", interval_s, lambda seen: seen[
        "status"] == 0 and seen["loss_to_first_step_s"] is not None)


def trial_lost_run(interval_s: float) -> dict:
    """One Tune trial whose worker node is removed without notice."""
    return _loss_run("tests.ray.lost_node_trial_run", interval_s, lambda seen: seen[
        "status"] == "TERMINATED" and seen.get("loss_to_first_step_s") is not None)


def trial_actor_run(interval_s: float) -> dict:
    """One one-replica Tune trial whose own node (the trial actor's) is removed."""
    return _loss_run("tests.ray.lost_node_trial_run", interval_s, lambda seen: seen[
        "status"] == "TERMINATED" and seen.get("loss_to_first_step_s") is not None,
        "actor")


def trial_drain_run() -> dict:
    """One Tune trial on a drained node, in its own process (own cluster)."""
    from tests.ray.drain_trial_run import EPOCHS, SIZE
    from tests.ray.interrupt_scenario import records
    with tempfile.TemporaryDirectory(prefix="trial-drain-") as d:
        record = Path(d) / "record"
        record.mkdir()
        seen, problem = _run("tests.ray.drain_trial_run", str(Path(d) / "storage"),
                             str(record), "60")
        if seen is None:
            return {"ok": False, "problem": problem}
        try:
            assert_exactly_once(records(record), SIZE, EPOCHS)
            exact = True
        except AssertionError as exc:
            exact, seen["problem"] = False, str(exc)[-500:]
    return {"ok": seen["status"] == "TERMINATED" and seen.get("drain_to_first_step_s")
            is not None, "exact": exact, **seen}


def _trained(row: dict) -> str:
    return "every sample trained" if row["complete"] else "SAMPLES MISSING"


def _lost_line(row: dict) -> str:
    saves = max(row["checkpoints"] or 1, 1)
    return (f"loss to first step {row['loss_to_first_step_s']:.1f} s, launches "
            f"{row['sizes']}, {row['repeated']} samples repeated (one interval: "
            f"{row['interval_samples']:.0f}), {row['checkpoints']} in-place checkpoints of "
            f"{row['checkpoint_s'] / saves:.2f} s each, {_trained(row)}")


def _trial_lost_line(row: dict) -> str:
    return (f"loss to first step {row['loss_to_first_step_s']:.1f} s, launches "
            f"{row['sizes']}, failures {row['failures']}, {row['repeated']} samples "
            f"repeated (one interval: {row['interval_samples']:.0f}), {_trained(row)}")


def _trial_actor_line(row: dict) -> str:
    return (f"loss to first step of the retry {row['loss_to_first_step_s']:.1f} s, "
            f"failures {row['failures']}, {row['repeated']} samples repeated (one "
            f"interval: {row['interval_samples']:.0f}), {_trained(row)}")


def _trial_drain_line(row: dict) -> str:
    return (f"drain to first step {row['drain_to_first_step_s']:.1f} s, launches "
            f"{row['sizes']}, failures {row['failures']}, "
            f"{'exactly once' if row['exact'] else 'NOT exactly once'}")


#: scenario name -> (one run, its line in the output)
SCENARIOS = {"lost": (lost_run, _lost_line), "trial-lost": (trial_lost_run, _trial_lost_line),
             "trial-actor": (trial_actor_run, _trial_actor_line),
             "trial-drain": (trial_drain_run, _trial_drain_line)}


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})" \
        if values else "n/a"


def _trial_summary(title: str, verb: str, rows: list[dict]) -> str:
    """One line over a lost-node trial scenario's runs."""
    ok = [r for r in rows if r["ok"]]
    if not ok:
        return f"{title}: no run {verb}"
    losses = [r["loss_to_first_step_s"] for r in ok if r.get("loss_to_first_step_s")]
    return (f"{title}: {len(ok)} of {len(rows)} {verb}, "
            f"{sum(r['complete'] for r in ok)} trained every sample, "
            f"{sum(r['failures'] == 0 for r in ok)} with no failure counted; loss to first "
            f"step median {_median(losses)}; repeated samples median "
            f"{statistics.median([r['repeated'] for r in ok])}")


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios (all, or ``--only`` one) ``--runs`` times, print each run and the
    medians; exit 1 unless every run recovered (and trained every sample: at least once
    after a loss, exactly once after a drain)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each scenario (default 5)")
    p.add_argument("--interval", type=float, default=2.0,
                   help="the lost-node job's and trial's checkpoint interval in seconds "
                        "(default 2)")
    p.add_argument("--only", choices=tuple(SCENARIOS), default=None)
    p.add_argument("--json", default=None, help="also write the raw rows here")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    rows: dict[str, list[dict]] = {name: [] for name in SCENARIOS}
    for i in range(args.runs):
        for name, (run, line) in SCENARIOS.items():
            if args.only not in (None, name):
                continue
            row = run() if name == "trial-drain" else run(args.interval)
            rows[name].append(row)
            print(f"{name} run {i + 1}: " + (
                line(row) if row["ok"] else f"failed: {row.get('problem', row)}"),
                flush=True)
    print(f"Machine: {machine_description()}")
    lost = [r for r in rows["lost"] if r["ok"]]
    if rows["lost"]:
        per_save = [r["checkpoint_s"] / r["checkpoints"] for r in lost if r.get("checkpoints")]
        share = statistics.mean(per_save) / DEFAULT_CHECKPOINT_INTERVAL_S if per_save else None
        print(f"lost node: {len(lost)} of {len(rows['lost'])} recovered, "
              f"{sum(r['complete'] for r in lost)} trained every sample; loss to first step "
              f"median {_median([r['loss_to_first_step_s'] for r in lost])}; repeated "
              f"samples median {statistics.median([r['repeated'] for r in lost]) if lost else 'n/a'}"
              f" (one interval {args.interval:g} s: {lost[0]['interval_samples']:.0f} samples)"
              if lost else "lost node: no run recovered")
        if share is not None:
            print(f"in-place checkpoint: mean {statistics.mean(per_save):.2f} s; at the default "
                  f"interval of {DEFAULT_CHECKPOINT_INTERVAL_S:g} s that is "
                  f"{100 * share:.2f}% of the time")
    for name, title, verb in (("trial-lost", "trial on a lost node", "continued"),
                              ("trial-actor", "trial whose own node was lost",
                               "resumed from the kept checkpoint")):
        if rows[name]:
            print(_trial_summary(title, verb, rows[name]))
    drained = [r for r in rows["trial-drain"] if r["ok"]]
    if rows["trial-drain"]:
        print(f"trial drain: {len(drained)} of {len(rows['trial-drain'])} moved, "
              f"{sum(r['exact'] for r in drained)} exactly once, "
              f"{sum(r['failures'] == 0 for r in drained)} with no failure counted; drain to "
              f"first step median {_median([r['drain_to_first_step_s'] for r in drained])}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    ok = all(r["ok"] and r["complete"] for r in rows["lost"] + rows["trial-lost"] +
             rows["trial-actor"]) and \
        all(r["ok"] and r["exact"] for r in rows["trial-drain"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
