"""AdaptDL jobs as Ray's Job Submission API holds them: each ``submit`` is one Ray job
(submission id ``adaptdl-<name>-<k>``) whose metadata carries the job's name, storage path
and owner."""

from __future__ import annotations

from typing import Any

from adaptdl_ray.cli.cluster import Cluster
from adaptdl_ray.cli.errors import PROG, CliError
from adaptdl_ray.cluster.job_files import JobFiles
from adaptdl_ray.cluster.owner import current_owner

__all__ = ["NAME_KEY", "STORAGE_KEY", "OWNER_KEY", "TERMINAL", "submissions", "latest",
           "status_of", "files_of", "owner_of", "refuse_others"]

NAME_KEY = "adaptdl_name"
STORAGE_KEY = "adaptdl_storage_path"
OWNER_KEY = "adaptdl_owner"
#: Ray job states after which a submission runs no more.
TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})


def submissions(client: Any, name: str | None = None) -> list[Any]:
    """The AdaptDL submissions on the cluster (of job ``name``), oldest first."""
    jobs = [j for j in client.list_jobs()
            if (j.metadata or {}).get(NAME_KEY) and j.submission_id
            and (name is None or j.metadata[NAME_KEY] == name)]
    return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id))


def latest(cluster: Cluster, name: str) -> Any:
    """The newest submission of job ``name``.

    Raises:
        CliError: the cluster has no job of that name."""
    found = submissions(cluster.jobs(), name)
    if not found:
        raise CliError(f"no job named {name!r} on {cluster.describe()}: see `{PROG} ls`")
    return found[-1]


def status_of(details: Any) -> str:
    """Ray's status of a submission (``RUNNING``, ``STOPPED``...)."""
    return str(getattr(details.status, "value", details.status))


def files_of(details: Any) -> JobFiles:
    """The job files of a submission (its storage path as submitted, read here)."""
    meta = details.metadata or {}
    return JobFiles(meta[NAME_KEY], meta.get(STORAGE_KEY) or None)


def owner_of(details: Any) -> str | None:
    """Who submitted it (``user@host``), if recorded."""
    return (details.metadata or {}).get(OWNER_KEY) or None


def refuse_others(details: Any, verb: str, force: bool) -> None:
    """Refuse ``verb`` on another person's job unless ``force`` (a guard against mistakes:
    see :mod:`adaptdl_ray.cluster.owner`).

    Raises:
        CliError: the job has another owner and ``force`` is false."""
    owner = owner_of(details)
    if owner is None or force or owner == current_owner():
        return
    name = details.metadata[NAME_KEY]
    raise CliError(f"job {name} is {owner}'s, not yours ({current_owner()}): "
                   f"`{PROG} {verb} --force {name}` if you mean it")
