"""The files of one submitted job under its storage path.

::

    <storage_path>/<name>/
        job.json                        what was submitted (script, arguments, replica spec)
        status.json                     the job's state as its driver last wrote it
        checkpoint/checkpoint-<seq>/    the newest adaptdl_core checkpoint (and one older
                                        intact one as a fallback), as ADAPTDL_CHECKPOINT_PATH
                                        holds them (see adaptdl_core.checkpoint)
        adaptdl_scheduler_state.json    the decision core's record of the job

The replicas checkpoint into directories of their own nodes (no shared filesystem is
needed); the driver moves rank 0's newest checkpoint here at every stop, resize and end,
so a new submission of the same name resumes from it exactly where the job stopped, and
``adaptdl-ray cp`` copies it out. This module needs neither Ray nor torch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from adaptdl_core import checkpoint
from adaptdl_core.decision import write_atomic
from adaptdl_core.launch import ResumePoint, resume_point

LOG = logging.getLogger(__name__)

__all__ = ["DEFAULT_STORAGE_PATH", "JobFiles", "check_name", "storage_root"]

#: Where jobs keep their files when neither ``--storage-path`` nor
#: ``ADAPTDL_STORAGE_PATH`` says otherwise (expanded on the machine that reads it).
DEFAULT_STORAGE_PATH = "~/adaptdl_jobs"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_CHECKPOINT_DIR = "checkpoint"
_STATUS = "status.json"
_JOB = "job.json"


def check_name(name: Any) -> str:
    """``name`` if it is a valid job name: 1 to 63 letters, digits, ``_``, ``.`` or
    ``-``, starting with a letter or digit (it names a directory and a Ray submission).

    Raises:
        ValueError: otherwise (the message says what is allowed).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"job name {name!r} is not valid: use 1 to 63 letters, digits, "
                         "'_', '.' or '-', starting with a letter or digit")
    return name


def storage_root(storage_path: str | os.PathLike | None) -> Path:
    """The storage root: ``storage_path``, else ``$ADAPTDL_STORAGE_PATH``, else
    :data:`DEFAULT_STORAGE_PATH`, with ``~`` expanded."""
    raw = storage_path or os.environ.get("ADAPTDL_STORAGE_PATH") or DEFAULT_STORAGE_PATH
    return Path(os.path.expanduser(os.fspath(raw))).absolute()


class JobFiles:
    """The files of job ``name`` under ``storage_path`` (see the module docstring).

    Raises:
        ValueError: an invalid job name.
    """

    def __init__(self, name: str, storage_path: str | os.PathLike | None = None) -> None:
        self.name = check_name(name)
        self.root = storage_root(storage_path) / name

    @property
    def checkpoint_path(self) -> Path:
        """The job's ``ADAPTDL_CHECKPOINT_PATH``-style directory."""
        return self.root / _CHECKPOINT_DIR

    def exists(self) -> bool:
        """Whether the job ever ran with this storage path."""
        return (self.root / _JOB).exists() or self.checkpoint_path.exists()

    # -- checkpoints ------------------------------------------------------------------
    def resume_point(self) -> ResumePoint | None:
        """Where a new run resumes (see :func:`adaptdl_core.launch.resume_point`).

        Raises:
            adaptdl_core.checkpoint.CheckpointError: every checkpoint is damaged.
        """
        if not self.checkpoint_path.is_dir():
            return None
        return resume_point(self.checkpoint_path)

    def latest_checkpoint(self) -> str | None:
        """The newest intact checkpoint directory, or ``None``."""
        if not self.checkpoint_path.is_dir():
            return None
        return checkpoint.latest_checkpoint_dir(self.checkpoint_path)

    def store_checkpoint(self, archive: bytes) -> str:
        """Put a checkpoint archive (``checkpoint-<seq>/`` as tar bytes, see
        :mod:`adaptdl_ray.replicas.transfer`) in place as the newest checkpoint: unpacked
        beside the others, verified, renamed into place; older ones are removed except
        the newest intact one before it.

        Returns:
            the checkpoint's directory.

        Raises:
            ValueError: the archive holds no single ``checkpoint-<seq>`` directory.
            adaptdl_core.checkpoint.CheckpointError: the checkpoint in it is damaged.
        """
        from adaptdl_ray.replicas import transfer
        self.checkpoint_path.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".incoming-", dir=self.checkpoint_path)
        try:
            transfer.unpack(archive, tmp)
            entries = os.listdir(tmp)
            if len(entries) != 1 or not entries[0].startswith("checkpoint-"):
                raise ValueError(f"a checkpoint archive holds one checkpoint-<seq> directory, "
                                 f"this one holds {entries}")
            checkpoint.verify_checkpoint(os.path.join(tmp, entries[0]))
            final = self.checkpoint_path / entries[0]
            if not final.exists():
                os.rename(os.path.join(tmp, entries[0]), final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._prune(final)
        return str(final)

    def _prune(self, newest: Path) -> None:
        """Remove every checkpoint but ``newest`` and the newest intact one before it."""
        def seq(path: Path) -> int:
            try:
                return int(path.name.split("-", 1)[1])
            except (IndexError, ValueError):
                return -1
        older = sorted((p for p in self.checkpoint_path.iterdir()
                        if p.name.startswith("checkpoint-") and seq(p) >= 0
                        and seq(p) < seq(newest)), key=seq, reverse=True)
        kept = False
        for path in older:
            if not kept:
                try:
                    checkpoint.verify_checkpoint(str(path))
                    kept = True
                    continue
                except checkpoint.CheckpointError:
                    pass
            shutil.rmtree(path, ignore_errors=True)

    def copy_latest(self, dest: str | os.PathLike) -> str:
        """Copy the newest intact checkpoint out: into ``dest`` if it is an existing
        directory (as ``dest/checkpoint-<seq>``), else to the new directory ``dest``.

        Returns:
            the copy's directory.

        Raises:
            FileNotFoundError: the job has no checkpoint yet.
            FileExistsError: the copy's directory exists already.
        """
        latest = self.latest_checkpoint()
        if latest is None:
            raise FileNotFoundError(f"job {self.name} has no checkpoint in {self.checkpoint_path}"
                                    " yet (one is written when it stops, resizes or ends)")
        dest = Path(dest).absolute()
        target = dest / os.path.basename(latest) if dest.is_dir() else dest
        if target.exists():
            raise FileExistsError(f"{target} exists already: pass a new directory")
        shutil.copytree(latest, target)
        return str(target)

    # -- records ----------------------------------------------------------------------
    def write_job(self, record: dict[str, Any]) -> None:
        """Write what was submitted (``job.json``)."""
        write_atomic(str(self.root), _JOB, json.dumps(record, indent=1))

    def read_job(self) -> dict[str, Any] | None:
        """``job.json``, or ``None`` if absent or unreadable."""
        return self._read(_JOB)

    def write_status(self, status: dict[str, Any]) -> None:
        """Write the job's current state (``status.json``), stamped with ``updated``."""
        write_atomic(str(self.root), _STATUS,
                     json.dumps({**status, "updated": time.time()}, indent=1))

    def read_status(self) -> dict[str, Any] | None:
        """``status.json``, or ``None`` if absent or unreadable."""
        return self._read(_STATUS)

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            with open(self.root / name) as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            LOG.warning("cannot read %s: %s", self.root / name, exc)
            return None
        return data if isinstance(data, dict) else None
