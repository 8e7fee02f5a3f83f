"""Named pieces of job state that survive checkpoint-restarts, written atomically.

Every object that must survive a restart (model, optimizer, data loader position, epoch
counter, accumulators, profiles) is a :class:`State` with a unique name. States are
created in the same order on every replica and after every restart; each one reloads
itself with :func:`load_state` when it is created.

On disk a checkpoint is one directory ``<ADAPTDL_CHECKPOINT_PATH>/checkpoint-<seq>/``
holding one file per state (the file name is the state's name) and a ``MANIFEST.json``.
Only replica 0 writes. A checkpoint is first written into a temporary sibling directory,
every file is flushed and fsynced, and the directory is then renamed into place, so a
crash mid-write leaves the previous checkpoint as the latest complete one. Older
checkpoints are removed only after the new one is in place.

The files our own states write load under ``torch.load(..., weights_only=True)`` (tensors
and plain Python containers) or are JSON.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import IO, Any

from adaptdl_core import context, env

__all__ = ["State", "save_state", "load_state", "save_all_states", "latest_checkpoint_dir",
           "state_names"]

LOG = logging.getLogger(__name__)

_CKPT_PREFIX = "checkpoint-"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_MANIFEST = "MANIFEST.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")

# The registry of live States and the restore point are the job context's
# (adaptdl_core.context.StateRegistry). The restore point is the newest checkpoint at the
# first load; after each save in this run, the new checkpoint, which carries over (hard
# links) the restored files of the States this run has not created yet, so those still
# load their pre-restart values.


def _registry() -> context.StateRegistry:
    return context.current().states


class State:
    """A named piece of state that is saved in checkpoints and restored after restarts.

    Subclasses implement :meth:`save` and :meth:`load`, and may override :meth:`sync` to
    make the state consistent across replicas before it is saved (it runs on every
    replica; only replica 0's copy is written).

    Arguments:
        name: unique name; letters, digits, ``_``, ``-`` and ``.`` only, since it is
            used as a file name.

    Raises:
        ValueError: if the name is empty, contains other characters, or is already used
            by another live State.
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in (".", ".."):
            raise ValueError(f"State name {name!r} is invalid: use a non-empty name of "
                             "letters, digits, '_', '-' and '.'")
        if name == _MANIFEST:
            raise ValueError(f"State name {name!r} is reserved for the checkpoint manifest")
        self.name = name
        _registry().add(self)  # (raises ValueError for a name in use)

    def save(self, fileobj: IO[bytes]) -> None:
        """Write this state to the binary file object ``fileobj``."""
        raise NotImplementedError

    def load(self, fileobj: IO[bytes]) -> None:
        """Restore this state from the binary file object ``fileobj``."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make this state consistent across replicas before a save (default: nothing)."""


def state_names() -> list[str]:
    """The names of the live States of this job, in registration order."""
    return _registry().names()


def _checkpoint_dirs(root: str) -> list[tuple[int, str]]:
    found = []
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _CKPT_RE.match(entry)
        if match and os.path.isdir(os.path.join(root, entry)):
            found.append((int(match.group(1)), os.path.join(root, entry)))
    return sorted(found)


def latest_checkpoint_dir(root: str | None = None) -> str | None:
    """Path of the newest complete checkpoint under ``root`` (default: the checkpoint path
    from the environment), or ``None`` if there is none."""
    root = root if root is not None else env.checkpoint_path()
    if root is None:
        return None
    dirs = _checkpoint_dirs(root)
    return dirs[-1][1] if dirs else None


def _restore_dir() -> str | None:
    registry = _registry()
    if registry.restore_dir is context.StateRegistry.UNKNOWN:
        registry.restore_dir = latest_checkpoint_dir()
        if registry.restore_dir is not None:
            LOG.info("restoring states from %s", registry.restore_dir)
    return registry.restore_dir


def load_state(state: State) -> bool:
    """Load ``state`` from the checkpoint this job restarted from, if it holds one.

    Returns:
        True if the state was found and loaded, False otherwise (first run, no checkpoint
        path, or a state that did not exist when the checkpoint was taken).
    """
    registry = _registry()
    ckpt = _restore_dir()
    if ckpt is None:
        return False
    if not os.path.isdir(ckpt):
        # Replica 0 saved a newer checkpoint (carrying over the files of states not yet
        # created) and removed this one; other replicas follow it here.
        registry.restore_dir = ckpt = latest_checkpoint_dir()
        if ckpt is None:
            return False
    path = os.path.join(ckpt, state.name)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        if os.path.isdir(ckpt):
            return False  # the checkpoint does not hold this state
        # Removed between the check and the open: look again.
        registry.restore_dir = context.StateRegistry.UNKNOWN
        return load_state(state)
    with f:
        state.load(f)
    return True


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_state_file(directory: str, state: State) -> int:
    # Serialise to memory first so that a failing save() never leaves a partial file.
    buf = io.BytesIO()
    state.save(buf)
    data = buf.getvalue()
    with open(os.path.join(directory, state.name), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data)


def _carry_over(tmp: str, source: str | None, names: list[str]) -> None:
    """Hard-link into ``tmp`` the files of ``source`` that ``tmp`` lacks (in place, the
    names list grows), so that a checkpoint keeps states this run has not re-created."""
    if source is None or not os.path.isdir(source):
        return
    for entry in os.listdir(source):
        if entry == _MANIFEST or entry in names:
            continue
        # Hard links make this copy free; checkpoint files are never modified in place.
        os.link(os.path.join(source, entry), os.path.join(tmp, entry))
        names.append(entry)


def _move_restore_point(final: str) -> None:
    # The new checkpoint holds (carried over) every state of the old restore point that
    # this run has not created yet, so later loads may read from it.
    registry = _registry()
    if registry.restore_dir is not context.StateRegistry.UNKNOWN \
            and registry.restore_dir is not None:
        registry.restore_dir = final


def _commit(root: str, tmp: str, names: list[str]) -> str:
    """Write the manifest, then rename ``tmp`` into place as the next checkpoint."""
    _carry_over(tmp, _restore_dir(), names)
    with open(os.path.join(tmp, _MANIFEST), "w") as f:
        json.dump({"states": names, "time": time.time(),
                   "num_restarts": env.num_restarts(),
                   "num_replicas": env.num_replicas()}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    existing = _checkpoint_dirs(root)
    seq = existing[-1][0] + 1 if existing else 0
    final = os.path.join(root, f"{_CKPT_PREFIX}{seq}")
    os.rename(tmp, final)
    _fsync_dir(root)
    _move_restore_point(final)
    # Only now that the new checkpoint is complete may the older ones go.
    for _, old in existing:
        shutil.rmtree(old, ignore_errors=True)
    for entry in os.listdir(root):
        if entry.startswith(".tmp-") and os.path.join(root, entry) != tmp:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return final


def _new_tmp_dir(root: str) -> str:
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix=".tmp-", dir=root)


def save_all_states() -> str | None:
    """Checkpoint every registered State.

    Must be called by every replica at the same point: each state's :meth:`State.sync`
    runs first (in registration order), then replica 0 writes all of them into a new
    checkpoint directory, atomically.

    Returns:
        The new checkpoint directory on replica 0; ``None`` on other replicas or when no
        checkpoint path is set.
    """
    states = _registry().states()
    for state in states:
        state.sync()
    root = env.checkpoint_path()
    if root is None or env.replica_rank() != 0:
        return None
    start = time.perf_counter()
    tmp = _new_tmp_dir(root)
    total = 0
    try:
        for state in states:
            total += _write_state_file(tmp, state)
        final = _commit(root, tmp, [s.name for s in states])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    LOG.info("saved %d states (%.1f KiB) to %s in %.3f s", len(states), total / 1024,
             final, time.perf_counter() - start)
    return final


def save_state(state: State, sync: bool = True) -> str | None:
    """Checkpoint a single State, keeping the other states of the latest checkpoint.

    Arguments:
        state: a registered State.
        sync: run ``state.sync()`` first (then every replica must call this together).

    Returns:
        The new checkpoint directory on replica 0; ``None`` elsewhere or without a
        checkpoint path.

    Raises:
        ValueError: if ``state`` is not registered.
    """
    if _registry().get(getattr(state, "name", None)) is not state:
        raise ValueError(f"{state!r} is not a registered State")
    if sync:
        state.sync()
    root = env.checkpoint_path()
    if root is None or env.replica_rank() != 0:
        return None
    tmp = _new_tmp_dir(root)
    try:
        names = [state.name]
        _write_state_file(tmp, state)
        _carry_over(tmp, latest_checkpoint_dir(root), names)
        return _commit(root, tmp, names)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def dump_json(obj: Any, fileobj: IO[bytes]) -> None:
    """Write ``obj`` as UTF-8 JSON into a binary file object (for simple States)."""
    fileobj.write(json.dumps(obj).encode("utf-8"))


def load_json(fileobj: IO[bytes]) -> Any:
    """Read UTF-8 JSON from a binary file object (the inverse of :func:`dump_json`)."""
    return json.loads(fileobj.read().decode("utf-8"))
