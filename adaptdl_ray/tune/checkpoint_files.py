"""The files of an AdaptDL trial's Tune checkpoint, and of the state it saves when interrupted.

A Tune checkpoint of an AdaptDL trial is the user's own checkpoint (the files the training
function last passed to ``tune.report(..., checkpoint=...)``, at the top level, exactly as
reported) plus a hidden ``.adaptdl/`` directory the user need not look at::

    checkpoint_000003/
        model.pt ...                 the user's files (their latest report's)
        .adaptdl/trial.json          the trial's record (TrialProgress)
        .adaptdl/state/checkpoint-N/ the job's adaptdl_core checkpoint (model, optimizer,
                                     data position, epoch, ...): resumes at that batch
        .adaptdl/pending-<i>.tar     user checkpoints of reports Tune has not received yet

When the driver is interrupted (Ctrl-C, SIGTERM), a running trial saves the same layout,
packed into one file, into its trial directory on the run's storage
(:data:`INTERRUPTED_FILE`); a restore takes it when it is newer than Tune's latest
checkpoint of the trial (see :func:`read_interrupted`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from typing import Any

from adaptdl_core import checkpoint as core_checkpoint
from adaptdl_ray.replicas import transfer
from adaptdl_ray.tune.trial_progress import TrialProgress

LOG = logging.getLogger(__name__)

__all__ = ["RESERVED_DIR", "INTERRUPTED_FILE", "write", "read", "write_interrupted",
           "read_interrupted", "has_interrupted", "restore_result_files",
           "restore_result_files_of", "read_newer_kept", "adaptdl_state_dir"]

# The result files Tune's loggers append to (progress.csv, result.json).
_RESULT_FILES = ("progress.csv", "result.json")

# (adaptdl_core.checkpoint.EMBEDDED_ROOTS names RESERVED_DIR/_STATE, so that
# adaptdl_core.torch.model_state_dict finds the state in a trial's checkpoint.)
RESERVED_DIR = ".adaptdl"
INTERRUPTED_FILE = ".adaptdl-interrupted.tar"
_RECORD = "trial.json"
_STATE = "state"


def write(directory: str, progress: TrialProgress, state_archive: bytes | None,
          user_files: bytes | None) -> None:
    """Lay out a checkpoint in ``directory`` (created if needed; it should be empty).

    Args:
        progress: the trial's record (its pending reports' user checkpoints are written
            beside it).
        state_archive: the adaptdl_core checkpoint as tar bytes (``None``: none yet).
        user_files: the user's latest checkpoint as tar bytes (``None``: none reported).
    """
    reserved = os.path.join(directory, RESERVED_DIR)
    os.makedirs(reserved, exist_ok=True)
    if user_files is not None:
        transfer.unpack(user_files, directory)
    if state_archive is not None:
        transfer.unpack(state_archive, os.path.join(reserved, _STATE))
    for i, report in enumerate(progress.pending):
        if report.user_checkpoint is not None:
            with open(os.path.join(reserved, f"pending-{i}.tar"), "wb") as f:
                f.write(report.user_checkpoint)
    # The record last: a checkpoint with a record is complete.
    with open(os.path.join(reserved, _RECORD), "w") as f:
        f.write(progress.to_json())


def read(directory: str) -> tuple[TrialProgress, bytes | None, bytes | None]:
    """Read a checkpoint laid out by :func:`write`.

    Returns:
        ``(progress, state_archive, user_files)`` as :func:`write` took them.

    Raises:
        ValueError: ``directory`` is not an AdaptDL trial checkpoint (no ``.adaptdl/``
            record), or its record is malformed.
    """
    reserved = os.path.join(directory, RESERVED_DIR)
    record = os.path.join(reserved, _RECORD)
    if not os.path.isfile(record):
        raise ValueError(f"{directory} is not an AdaptDL trial checkpoint (no "
                         f"{RESERVED_DIR}/{_RECORD}); restore AdaptDL trials only from "
                         "checkpoints they wrote")
    with open(record) as f:
        text = f.read()
    progress = TrialProgress.from_json(text)
    for i, has in enumerate(TrialProgress.pending_flags(text)):
        if has:
            with open(os.path.join(reserved, f"pending-{i}.tar"), "rb") as f:
                progress.pending[i].user_checkpoint = f.read()
    state_dir = os.path.join(reserved, _STATE)
    state_archive = transfer.pack_latest_checkpoint(state_dir) if os.path.isdir(state_dir) \
        else None
    user_entries = [e for e in sorted(os.listdir(directory)) if e != RESERVED_DIR]
    user_files = transfer.pack_entries(directory, user_entries) if user_entries else None
    return progress, state_archive, user_files


def write_interrupted(storage: Any, progress: TrialProgress, state_archive: bytes | None,
                      user_files: bytes | None) -> str:
    """Save the state of an interrupted trial into its trial directory on the run's storage,
    atomically (a temporary name, then a rename), replacing an older one.

    Args:
        storage: the trial's ``StorageInfo`` (from the Ray-private adapter module).

    Returns:
        the path written on the storage filesystem.
    """
    with tempfile.TemporaryDirectory(prefix="adaptdl-interrupted-") as tmp:
        write(tmp, progress, state_archive, user_files)
        data = transfer.pack_entries(tmp, sorted(os.listdir(tmp)))
    fs, final = storage.filesystem, f"{storage.trial_fs_path}/{INTERRUPTED_FILE}"
    partial = f"{final}.{uuid.uuid4().hex}.tmp"
    fs.create_dir(storage.trial_fs_path, recursive=True)
    with fs.open_output_stream(partial) as f:
        f.write(data)
    fs.move(partial, final)
    return final


def has_interrupted(filesystem: Any, trial_fs_path: str) -> bool:
    """Whether an interrupted run of the trial at ``trial_fs_path`` saved its state there."""
    import pyarrow.fs

    info = filesystem.get_file_info(f"{trial_fs_path}/{INTERRUPTED_FILE}")
    return info.type == pyarrow.fs.FileType.File


def restore_result_files(filesystem: Any, trial_fs_path: str, local_dir: str) -> list[str]:
    """Copy a trial's result files from its storage to its local directory, where Tune's
    loggers append to them, unless they are there already.

    Tune restores them only for a trial that has a Tune checkpoint (a trial without one
    starts again from scratch); a trial resuming from the state it saved on an interrupt
    continues its results, so the scheduler restores them itself.

    Returns:
        the names of the files copied.
    """
    import pyarrow.fs

    copied = []
    for name in _RESULT_FILES:
        local, remote = os.path.join(local_dir, name), f"{trial_fs_path}/{name}"
        if os.path.exists(local) or \
                filesystem.get_file_info(remote).type != pyarrow.fs.FileType.File:
            continue
        os.makedirs(local_dir, exist_ok=True)
        pyarrow.fs.copy_files(remote, local, source_filesystem=filesystem)
        copied.append(name)
    return copied


def restore_result_files_of(trial: Any) -> None:
    """For a Tune ``trial`` about to start: if it resumes from the state it saved on an
    interrupt (and from no Tune checkpoint), its result files are restored so that it
    continues its ``progress.csv``, which Tune would start afresh. A failure to copy them
    is logged, not raised (the trial runs on)."""
    storage = getattr(trial, "storage", None)
    if storage is None or trial.checkpoint is not None:
        return
    try:
        local, remote = trial.local_path, trial.path
    except RuntimeError:  # a new trial: it has no directory yet
        return
    if not local:
        return
    try:
        if has_interrupted(storage.storage_filesystem, remote):
            restore_result_files(storage.storage_filesystem, remote, local)
    except OSError as exc:
        LOG.warning("trial %s: could not restore its result files: %s", trial.trial_id, exc)


def read_newer_kept(storage: Any, seq: int
                    ) -> tuple[TrialProgress, bytes | None, bytes | None] | None:
    """The state a trial kept in its directory (saved on an interrupt, or its newest
    in-place checkpoint; see :func:`read_interrupted`) if it is newer than the record
    numbered ``seq`` the trial has; ``None`` otherwise, or outside Tune (``storage``
    ``None``), or when it cannot be read (logged: the trial resumes from Tune's)."""
    if storage is None:
        return None
    try:
        saved = read_interrupted(storage)
    except (OSError, ValueError) as exc:
        LOG.warning("ignoring the state kept in %s: %s", storage.trial_fs_path, exc)
        return None
    return saved if saved is not None and saved[0].seq > seq else None


def read_interrupted(storage: Any) -> tuple[TrialProgress, bytes | None, bytes | None] | None:
    """The state an interrupted run of this trial saved (as :func:`read` returns it), or
    ``None`` if there is none."""
    fs, path = storage.filesystem, f"{storage.trial_fs_path}/{INTERRUPTED_FILE}"
    if not has_interrupted(fs, storage.trial_fs_path):
        return None
    with fs.open_input_stream(path) as f:
        data = f.read()
    with tempfile.TemporaryDirectory(prefix="adaptdl-interrupted-") as tmp:
        transfer.unpack(data, tmp)
        return read(tmp)


def adaptdl_state_dir(checkpoint_dir: str) -> str | None:
    """The adaptdl_core checkpoint inside an AdaptDL trial's checkpoint directory, or
    ``None`` if it holds none."""
    return core_checkpoint.latest_checkpoint_dir(os.path.join(checkpoint_dir, RESERVED_DIR,
                                                              _STATE))
