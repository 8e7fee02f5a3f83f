"""The result rows an AdaptDL trial hands to Tune: the user's metrics plus ``adaptdl/`` keys.

Tune's CSV logger fixes ``progress.csv``'s columns from a trial's first result (and again,
without a header, from the first result after a ``Tuner.restore``), so every result lists
the same ``adaptdl/`` keys in the same order from the first one on, and the user's keys in
the order of the trial's first result (:func:`result_row`).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

__all__ = ["METRIC_PREFIX", "STATUS_KEYS", "RESIZE_PHASES", "PROGRESS_COLUMNS", "result_row",
           "order_like", "check_metric", "resize_phases"]

METRIC_PREFIX = "adaptdl/"
# adaptdl_core.torch.status.training_status() keys, in the order they appear in results.
STATUS_KEYS = ("replicas", "nodes", "restarts", "batch_size", "local_bsz", "accum_steps",
               "goodput", "efficiency", "gain", "noise_scale", "progress", "epochs_done",
               "epochs", "samples_seen", "epoch_samples", "data_passes")
# Phases of a resize or relaunch (see resize_phases), reported as adaptdl/resize/<phase>.
RESIZE_PHASES = ("checkpoint_s", "save_s", "relaunch_s", "worker_start_s", "restore_s",
                 "first_step_s", "decided_to_stop_s")

# Columns for Tune's progress table (result key -> column title), to merge with the
# trial's own metrics: ``CLIReporter(metric_columns={"acc": "acc", **PROGRESS_COLUMNS})``.
# The samples and passes stand beside the epochs because, with autoscale_batch_size, an
# epoch ends by statistical progress and may consume more or fewer samples than a pass.
PROGRESS_COLUMNS = {METRIC_PREFIX + "epochs_done": "epochs",
                    METRIC_PREFIX + "samples_seen": "samples",
                    METRIC_PREFIX + "data_passes": "passes",
                    METRIC_PREFIX + "replicas": "replicas",
                    METRIC_PREFIX + "restarts": "restarts",
                    METRIC_PREFIX + "batch_size": "batch"}


def result_row(metrics: Mapping[str, Any], status: Mapping[str, Any], *, launch_s: float,
               resize_s: float, phases: Mapping[str, float] | None) -> dict[str, Any]:
    """One result: the user's ``metrics``, then every ``adaptdl/`` key.

    Args:
        metrics: what the training function reported (its own keys win over ours).
        status: ``training_status()`` of rank 0 at the report (missing keys read 0).
        launch_s: seconds from the start of this launch of the trial to its first
            optimizer step (0 before it): what a relaunch costs at least.
        resize_s: seconds the trial's latest relaunch cost (0 before any).
        phases: that relaunch's phases in the first result after it; ``None`` elsewhere
            (the keys are still present, as 0.0).
    """
    row = dict(metrics)
    for key in STATUS_KEYS:
        row.setdefault(METRIC_PREFIX + key, status.get(key, 0))
    row.setdefault(METRIC_PREFIX + "launch_s", float(launch_s))
    row.setdefault(METRIC_PREFIX + "resize_s", float(resize_s))
    for phase in RESIZE_PHASES:
        row.setdefault(f"{METRIC_PREFIX}resize/{phase}",
                       float((phases or {}).get(phase, 0.0)))
    return row


def order_like(row: Mapping[str, Any], schema: Iterable[str]) -> dict[str, Any]:
    """``row`` with the keys of ``schema`` first, in its order, then any others."""
    out = {k: row[k] for k in schema if k in row}
    out.update((k, v) for k, v in row.items() if k not in out)
    return out


def check_metric(trial_id: str, metric: str | None, result: Mapping[str, Any]) -> None:
    """Raise if a trial's ``result`` lacks the experiment's ``metric`` (``None``: none set).

    Raises:
        ValueError: naming the metric, what the trial reported and the fix.
    """
    if metric and metric not in result:
        shown = sorted(k for k in result if not k.startswith(METRIC_PREFIX))
        raise ValueError(f"trial {trial_id} reported no {metric!r} (the metric given to "
                         f"tune.run/TuneConfig); it reported {shown}. Report it with "
                         "tune.report({...}) from the training function")


def resize_phases(pause: Mapping[str, float], setup_at: float,
                  timeline: Mapping[str, float]) -> dict[str, float]:
    """Split one checkpoint-relaunch cycle into phases (seconds).

    Args:
        pause: wall-clock times the checkpoint was ``requested``, the replicas ``stopped``
            (saved at a batch boundary) and the checkpoint was ``saved`` into Tune's
            directory.
        setup_at: when the relaunched trial actor began its launch.
        timeline: the new launch's milestones (``created``, ``workers_up``, ``ready``,
            ``first_step``; see ``WorkerGroup.timeline``); a missing ``first_step`` means
            "not seen", and the current time stands in for it.

    Returns:
        ``checkpoint_s`` (to a batch boundary, rank 0 writes), ``save_s`` (checkpoint
        bytes into Tune's directory), ``relaunch_s`` (Tune persists the checkpoint, frees
        and re-creates the placement group, starts the trial actor; also any time the trial
        waited for resources), ``worker_start_s`` (replica actors up), ``restore_s``
        (checkpoint handed over, torch imported, files unpacked), ``first_step_s`` (process
        group, states loaded, first optimizer step), their sum ``total_s``, and for a
        resize in place (``pause`` has when it was ``decided``) ``decided_to_stop_s``: the
        time from the scheduler's decision to the stop request, while the trial trained on
        (a grow's new replicas start then).
    """
    first = timeline.get("first_step", time.time())
    ready = timeline.get("ready", first)
    phases = {
        "checkpoint_s": pause["stopped"] - pause["requested"],
        "save_s": pause["saved"] - pause["stopped"],
        "relaunch_s": setup_at - pause["saved"],
        "worker_start_s": timeline["workers_up"] - timeline["created"],
        "restore_s": ready - timeline["workers_up"],
        "first_step_s": first - ready,
    }
    if "decided" in pause:  # (a resize in place: the trial trained on until the stop)
        phases["decided_to_stop_s"] = pause["requested"] - pause["decided"]
    phases = {k: max(float(v), 0.0) for k, v in phases.items()}
    phases["total_s"] = max(first - pause["requested"], 0.0)
    return phases
