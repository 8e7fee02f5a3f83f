"""``adaptdl-ray ls``: every AdaptDL job and trial on the cluster, in one table.

A submitted job's row comes from Ray's Job Submission API (its status) and from the
record its driver keeps in its storage (replicas, batch size, why it runs below its
maximum...); the cluster allocator adds what it knows of every job and trial it divides the
cluster among (its share, the trials of Tune sweeps, finished ones for a while). When the
allocator cannot be asked, the table says so in one line: trials are never left out
silently.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from adaptdl_ray.cli.cluster import Cluster
from adaptdl_ray.cli.errors import PROG, CliError
from adaptdl_ray.cli.submissions import NAME_KEY, files_of, owner_of, status_of, submissions

LOG = logging.getLogger(__name__)

__all__ = ["cmd_ls", "allocator_rows", "COLUMNS", "WIDE_COLUMNS"]

# Ray's job status -> the word ls shows (a running job's own record says more).
_STATUS_WORDS = {"PENDING": "pending", "RUNNING": "running", "STOPPED": "stopped",
                 "SUCCEEDED": "finished", "FAILED": "failed"}
#: The table's columns: (header, row key).
COLUMNS = (("NAME", "name"), ("STATUS", "status"), ("REPLICAS", "replicas"),
           ("NODES", "nodes"), ("BATCH", "batch_size"), ("GOODPUT", "goodput"),
           ("RESTARTS", "restarts"), ("AGE", "age_s"), ("EXPERIMENT", "experiment"),
           ("OWNER", "owner"), ("REASON", "reason"))
#: ``--wide`` adds these before REASON.
WIDE_COLUMNS = (("TARGET", "target"), ("MAX", "max_replicas"), ("EPOCHS", "epochs_shown"))
_LIVE = ("pending", "running", "resizing", "stopping", "moving")


def _row(details: Any, now: float) -> dict[str, Any]:
    """One submitted job as ls shows it: Ray's status, refined by the job's record."""
    files = files_of(details)
    record = files.read_status() or {}
    ray_status = status_of(details)
    status = _STATUS_WORDS.get(ray_status, ray_status.lower())
    # The job's own record says more (resizing, stopped after a checkpoint...) when it
    # was written by this submission's driver and agrees with Ray on whether it runs.
    current = (record.get("updated") or 0) * 1000 >= (details.start_time or 0)
    if current and (ray_status == "RUNNING" or record.get("status") in (
            "finished", "stopped") and ray_status in ("SUCCEEDED", "STOPPED")):
        status = record.get("status") or status
    elif ray_status == "RUNNING":
        status = "pending"  # its driver runs but has not started the replicas yet
    submitted = record.get("submitted") or (details.start_time or 0) / 1000.0
    live = status in _LIVE
    return {"name": files.name, "status": status, "kind": "job",
            "replicas": record.get("replicas", 0) if live else 0,
            "target": record.get("target", 0) if live else 0,
            "max_replicas": record.get("max_replicas"),
            "nodes": record.get("nodes"), "batch_size": record.get("batch_size"),
            "goodput": record.get("goodput"), "restarts": record.get("restarts", 0),
            "age_s": max(now - submitted, 0.0) if submitted else None,
            "experiment": record.get("experiment"), "epochs_done": record.get("epochs_done"),
            "epochs": record.get("epochs"), "submission_id": details.submission_id,
            "storage_path": str(files.root), "owner": owner_of(details),
            "reason": record.get("reason") if live else None}


def allocator_rows(cluster: Cluster) -> list[dict[str, Any]]:
    """Every job and trial the cluster allocator knows, live and recently ended ([] when
    no allocator runs).

    Raises:
        CliError: the allocator could not be asked (one line saying why)."""
    import ray
    from adaptdl_ray.cluster import client
    if not ray.is_initialized():
        cluster.connect()
    handle = client.get_allocator(create=False)
    if handle is None:
        return []
    try:
        return list(ray.get(handle.jobs.remote(), timeout=30))
    except Exception as exc:  # noqa: BLE001 - say it in one line
        raise CliError(f"the cluster allocator did not answer: "
                       f"{' '.join(str(exc).split()) or type(exc).__name__}") from None


def _format(key: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if key == "age_s":
        seconds = int(value)
        return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
            f"{seconds // 60}m{seconds % 60:02d}s"
    if key == "goodput":
        return f"{value:.1f}"
    return str(value)


def rows_of(cluster: Cluster) -> tuple[list[dict[str, Any]], str | None]:
    """Every row, sorted by name, and why the allocator's were left out (``None``: they
    were not)."""
    now = time.time()
    latest: dict[str, Any] = {}
    for details in submissions(cluster.jobs()):
        latest[details.metadata[NAME_KEY]] = details
    rows = {name: _row(details, now) for name, details in latest.items()}
    missing = None
    try:
        found = allocator_rows(cluster)
    except CliError as exc:
        found, missing = [], str(exc)
    for job in found:
        name = job.get("name")
        if not name:
            continue
        # A submitted job's own row (Ray's status, its record) is the newer; the
        # allocator adds what the row lacks (its share, for one). Trials of sweeps are
        # known to the allocator only.
        if job.get("kind") == "job":
            key = name
            job = dict(job, experiment=None)  # (a submitted job is no experiment's)
        else:
            key = f"{job.get('experiment')}\x1f{name}"
        own = rows.get(key, {})
        rows[key] = {**job, **{k: v for k, v in own.items() if v is not None}}
    for row in rows.values():
        done, total = row.get("epochs_done"), row.get("epochs")
        row["epochs_shown"] = f"{done}/{total}" if done is not None and total else None
    return sorted(rows.values(), key=lambda r: (str(r.get("experiment") or ""),
                                                 str(r["name"]))), missing


def cmd_ls(opts: argparse.Namespace) -> int:
    """List every AdaptDL job and trial on the cluster."""
    cluster = Cluster.from_options(opts)
    ordered, missing = rows_of(cluster)
    if missing is not None:
        LOG.warning("trials of Tune sweeps are not listed: %s", missing)
    if opts.json:
        print(json.dumps(ordered, indent=1, default=str))
        return 0
    columns = list(COLUMNS)
    if opts.wide:
        columns[-1:-1] = WIDE_COLUMNS
    table = [[header for header, _ in columns]]
    table += [[_format(key, row.get(key)) for _, key in columns] for row in ordered]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    if not ordered:
        print(f"(no AdaptDL job or trial on {cluster.describe()}; submit one with "
              f"`{PROG} submit`)")
    return 0
