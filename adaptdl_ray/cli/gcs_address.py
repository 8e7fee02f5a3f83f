"""The GCS address of the cluster behind a dashboard URL, asked of that cluster itself.

A Ray driver joins a cluster by its GCS address; people know the dashboard URL (what
``ray job submit`` takes), and Ray's HTTP API does not tell the GCS address. The cluster
does tell it to the jobs it runs (their ``RAY_ADDRESS``): so the first time a dashboard is
used, one tiny job prints it (about a second and a half on a quiet cluster), and the answer
is kept per dashboard and Ray session in ``~/.cache/adaptdl-ray/gcs-addresses.json``
(``$XDG_CACHE_HOME`` is honoured): later commands reuse it until the cluster restarts.
Searching this machine's Ray instances instead would find the wrong one, or hang on an
unresponsive one, wherever several run.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from adaptdl_core.decision import write_atomic
from adaptdl_ray.cli.errors import CliError

__all__ = ["gcs_address", "cache_file", "PROBE_PREFIX"]

#: Submission ids of the probe jobs start with this (they are deleted once read).
PROBE_PREFIX = "adaptdl-address-probe-"
_MARK = "ADAPTDL_GCS_ADDRESS="
_ENTRYPOINT = ("python -c \"import os; print('" + _MARK +
               "' + os.environ.get('RAY_ADDRESS', ''))\"")


def cache_file() -> Path:
    """Where the answers are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "adaptdl-ray" / "gcs-addresses.json"


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _keep(dashboard: str, session: str, address: str) -> None:
    cache = _read_cache()
    cache[dashboard] = {"session": session, "gcs": address}
    try:
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(cache_file().parent), cache_file().name, json.dumps(cache, indent=1))
    except OSError:
        pass  # (the next command asks again)


def gcs_address(dashboard: str, client: Any, session: str | None) -> str:
    """The GCS address of the cluster whose dashboard is ``dashboard``.

    Args:
        dashboard: its URL.
        client: its Job Submission client.
        session: the Ray session it serves (``None``: unknown; the answer is then not
            kept).

    Raises:
        CliError: the probe job failed or printed no address."""
    if session is not None:
        known = _read_cache().get(dashboard)
        if isinstance(known, dict) and known.get("session") == session and known.get("gcs"):
            return str(known["gcs"])
    submission_id = f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}"
    client.submit_job(entrypoint=_ENTRYPOINT, submission_id=submission_id,
                      metadata={"adaptdl_probe": "gcs-address"})
    while not client.get_job_status(submission_id).is_terminal():
        time.sleep(0.1)
    logs = client.get_job_logs(submission_id)
    try:
        client.delete_job(submission_id)
    except Exception:  # noqa: BLE001 - an old probe in Ray's job list harms nobody
        pass
    found = [line[len(_MARK):].strip() for line in logs.splitlines() if line.startswith(_MARK)]
    if not found or not found[-1]:
        raise CliError(f"the cluster at {dashboard} did not tell its GCS address (its job "
                       f"{submission_id} printed none): pass it with --address HEAD:6379")
    if session is not None:
        _keep(dashboard, session, found[-1])
    return found[-1]
