"""Named pieces of job state that survive checkpoint-restarts, written atomically.

Every object that must survive a restart (model, optimizer, data loader position, epoch
counter, accumulators, profiles) is a :class:`State` with a unique name. States are
created in the same order on every replica and after every restart; each one reloads
itself with :func:`load_state` when it is created.

On disk a checkpoint is one directory ``<ADAPTDL_CHECKPOINT_PATH>/checkpoint-<seq>/``
holding one file per state (the file name is the state's name) and a ``MANIFEST.json``
that lists every state with its size in bytes and its CRC-32, and the short
:meth:`State.summary` of the states that give one (e.g. whether training finished), so
that tools can tell what a checkpoint holds without loading it. Only replica 0 writes. A
checkpoint is first written into a temporary sibling directory, every file is flushed and
fsynced, and the directory is then renamed into place, so a crash mid-write leaves the
previous checkpoint as the latest complete one. Once the new checkpoint is in place and
verified, every older one is removed except the newest intact one, kept as a fallback.

Reads are verified: a restore picks the newest checkpoint whose manifest matches its files
(:func:`verify_checkpoint`) before any state loads, logs a warning naming each damaged
newer one it skips, and raises :class:`CheckpointError` naming the damaged files when no
intact checkpoint is left. Checkpoints written before manifests carried checksums are
accepted unverified (only their listed files must exist). A module may also have the
saved values of its states checked (:func:`register_content_check`, e.g. a loader
position past the end of its epoch): a checkpoint holding an impossible value is damaged
like one with a wrong checksum, so a restore uses either all of one checkpoint or none.

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
import zlib
from typing import IO, Any, Callable

from adaptdl_core import context, env

__all__ = ["State", "save_state", "load_state", "save_all_states", "latest_checkpoint_dir",
           "state_names", "verify_checkpoint", "register_content_check", "CheckpointError",
           "check_checkpoint_root", "find_checkpoint", "EMBEDDED_ROOTS"]

LOG = logging.getLogger(__name__)

_CKPT_PREFIX = "checkpoint-"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_MANIFEST = "MANIFEST.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_FORMAT = 2  # manifests with per-file size and CRC-32 ("files"); format 1 had only "states"
_CHUNK = 1 << 20
_RESCANS = 10


class CheckpointError(RuntimeError):
    """A checkpoint is damaged or cannot be loaded; the message names the file and what
    is wrong with it."""

# The registry of live States and the restore point are the job context's
# (adaptdl_core.context.StateRegistry). The restore point is the newest checkpoint at the
# first load; after each save in this run, the new checkpoint, which carries over (hard
# links) the restored files of the States this run has not created yet, so those still
# load their pre-restart values.


def _registry() -> context.StateRegistry:
    return context.current().states


# State name prefix -> check of a saved file's bytes. Registered at import time by the
# modules that own such states (like codecs: a property of the code, not of one job), so
# that a checkpoint is checked whole when it is chosen, before any of its states loads.
_CONTENT_CHECKS: dict[str, Callable[[bytes], None]] = {}


def register_content_check(prefix: str, check: Callable[[bytes], None]) -> None:
    """Have :func:`verify_checkpoint` check the saved bytes of every state whose name
    starts with ``prefix``: ``check(data)`` raises ``ValueError`` saying which value is
    impossible. A checkpoint failing a check is damaged: a restore skips it (with a
    warning naming the file and the message) for an older intact one, and a save that
    fails its read-back check raises.

    Registering the same prefix again replaces its check.

    Raises:
        ValueError: if ``prefix`` is empty or not a string, or ``check`` is not callable.
    """
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"register_content_check(prefix={prefix!r}): pass the non-empty "
                         "start of the state names to check")
    if not callable(check):
        raise ValueError(f"register_content_check(check={check!r}): pass a function of the "
                         "saved bytes that raises ValueError for an impossible value")
    _CONTENT_CHECKS[prefix] = check


def _content_check(name: str) -> Callable[[bytes], None] | None:
    for prefix, check in _CONTENT_CHECKS.items():
        if name.startswith(prefix):
            return check
    return None


def _check_content(path: str, data: bytes, check: Callable[[bytes], None]) -> None:
    try:
        check(data)
    except Exception as exc:
        raise CheckpointError(f"{path} holds an impossible value ({exc}): the checkpoint is "
                              "damaged") from None


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

    def summary(self) -> dict[str, Any] | None:
        """A few JSON values that describe this state, written into the checkpoint's
        manifest (``"summary": {name: ...}``) where tools read them without loading the
        state (default: ``None``, nothing)."""
        return None


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


def _file_entry(data: bytes) -> dict:
    return {"size": len(data), "crc32": zlib.crc32(data)}


def _file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _read_manifest(ckpt: str) -> dict:
    """The parsed manifest of ``ckpt``; raises CheckpointError if it is missing or
    malformed (FileNotFoundError if the directory itself is gone)."""
    path = os.path.join(ckpt, _MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if not os.path.isdir(ckpt):
            raise
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete or "
                              "damaged") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): the manifest is "
                              "damaged") from None
    states = manifest.get("states") if isinstance(manifest, dict) else None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not (isinstance(states, list) and all(isinstance(n, str) for n in states)):
        raise CheckpointError(f"{path} has no list of state names: the manifest is damaged")
    if files is not None and not (
            isinstance(files, dict) and set(files) == set(states)
            and all(isinstance(e, dict) and isinstance(e.get("size"), int)
                    and isinstance(e.get("crc32"), int) for e in files.values())):
        raise CheckpointError(f"{path} does not give a size and CRC-32 for every state it "
                              "lists: the manifest is damaged")
    return manifest


def _check_size(path: str, size: int, entry: dict) -> None:
    if size != entry["size"]:
        raise CheckpointError(f"{path} holds {size} bytes but the manifest says "
                              f"{entry['size']}: the file is truncated or damaged")


def _check_crc(path: str, crc: int, entry: dict) -> None:
    if crc != entry["crc32"]:
        raise CheckpointError(f"{path} does not match the CRC-32 in the manifest: its "
                              "content is damaged")


def _check_bytes(path: str, data: bytes, entry: dict | None) -> None:
    if entry is not None:
        _check_size(path, len(data), entry)
        _check_crc(path, zlib.crc32(data), entry)


def verify_checkpoint(ckpt: str) -> dict:
    """Check that the checkpoint directory ``ckpt`` is intact: its manifest parses and
    every state it lists exists with the listed size and CRC-32 (reads every file once).

    A manifest from before checksums were recorded is accepted unverified as long as every
    file it lists exists. Files of states with a registered content check
    (:func:`register_content_check`) must also pass it.

    Returns:
        The parsed manifest.

    Raises:
        CheckpointError: naming the first damaged or missing file and what is wrong.
        FileNotFoundError: if ``ckpt`` is not a directory.
    """
    if not os.path.isdir(ckpt):
        raise FileNotFoundError(f"verify_checkpoint: {ckpt!r} is not a directory")
    manifest = _read_manifest(ckpt)
    files = manifest.get("files")
    if files is None:
        LOG.debug("%s has a manifest without checksums (written by an older version): "
                  "accepted unverified", ckpt)
    for name in manifest["states"]:
        path = os.path.join(ckpt, name)
        check = _content_check(name)
        try:
            size = os.stat(path).st_size
            entry = None if files is None else files[name]
            if entry is not None:
                _check_size(path, size, entry)
            if check is not None:
                # (Small files: read once, then checksum and check those bytes.)
                with open(path, "rb") as f:
                    data = f.read()
                _check_bytes(path, data, entry)
                _check_content(path, data, check)
            elif entry is not None:
                _check_crc(path, _file_crc32(path), entry)
        except FileNotFoundError:
            if not os.path.isdir(ckpt):
                raise  # removed meanwhile (replica 0 saved a newer one): not damage
            raise CheckpointError(f"{path} is missing, but the manifest lists it: the "
                                  "checkpoint is damaged") from None
    return manifest


def latest_checkpoint_dir(root: str | os.PathLike | None = None) -> str | None:
    """Path of the newest intact checkpoint under ``root`` (default: the checkpoint path
    from the environment), or ``None`` if there is none.

    Each candidate is checked with :func:`verify_checkpoint`, newest first; a damaged one
    is skipped with a warning naming the file and what is wrong.

    Raises:
        TypeError: if ``root`` is neither a path (``str`` or ``os.PathLike``) nor None.
        CheckpointError: if ``root`` holds checkpoints but every one is damaged (the
            message names each damaged file; remove them to start from scratch).
    """
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"latest_checkpoint_dir(root={root!r}): root must be a directory "
                        f"path (str or os.PathLike) or None, got {type(root).__name__}")
    root = os.fspath(root) if root is not None else env.checkpoint_path()
    if root is None:
        return None
    # A checkpoint that vanishes while it is checked was removed by replica 0 after it
    # wrote a newer one (removal renames it away first, so it never looks half-deleted):
    # look again.
    for _ in range(_RESCANS):
        damaged = []
        for _, path in reversed(_checkpoint_dirs(root)):
            try:
                verify_checkpoint(path)
            except FileNotFoundError:
                break
            except CheckpointError as exc:
                LOG.warning("skipping damaged checkpoint %s: %s; falling back to an older "
                            "one", path, exc)
                damaged.append(str(exc))
                continue
            return path
        else:
            break
    else:
        raise CheckpointError(f"the checkpoints under {root} kept disappearing while they were "
                              "checked: is another job writing to the same checkpoint path?")
    if damaged:
        raise CheckpointError(f"no intact checkpoint is left under {root}: "
                              + "; ".join(damaged)
                              + ". Remove the damaged checkpoint directories to start from "
                              "scratch.")
    return None


#: Where a folder that is not itself a checkpoint root may hold one: a Ray Tune trial's
#: checkpoint keeps its AdaptDL state in ``.adaptdl/state``, a command-line job's storage
#: directory in ``checkpoint``.
EMBEDDED_ROOTS = (os.path.join(".adaptdl", "state"), "checkpoint")


def find_checkpoint(path: str | os.PathLike) -> str:
    """The newest intact checkpoint that ``path`` names or holds, whatever kind of folder
    a user has: one checkpoint (``checkpoint-<n>``, as ``adaptdl-ray cp`` copies it out),
    a checkpoint path (``ADAPTDL_CHECKPOINT_PATH``, holding ``checkpoint-<n>`` folders), or
    a folder that holds one of those in a place of :data:`EMBEDDED_ROOTS` (a Ray Tune
    trial's checkpoint, a command-line job's storage directory). ``~`` is expanded.

    Raises:
        TypeError: ``path`` is not a path.
        FileNotFoundError: ``path`` does not exist or is not a directory.
        ValueError: it holds no checkpoint (the message says where it looked).
        CheckpointError: it holds checkpoints, all of them damaged.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"find_checkpoint(path={path!r}): pass a directory path")
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a directory: pass a checkpoint folder (a "
                                "checkpoint-<n> folder, a checkpoint path, a Tune trial's "
                                "checkpoint or a job's storage directory)")
    if os.path.isfile(os.path.join(path, _MANIFEST)):
        verify_checkpoint(path)
        return path
    looked = [path] + [os.path.join(path, sub) for sub in EMBEDDED_ROOTS]
    for root in looked:
        if os.path.isdir(root):
            found = latest_checkpoint_dir(root)
            if found is not None:
                return found
    raise ValueError(f"{path} holds no AdaptDL checkpoint: it has no {_MANIFEST} and no "
                     f"{_CKPT_PREFIX}<n> folder in any of {looked}")


def _restore_dir() -> str | None:
    registry = _registry()
    if registry.restore_dir is context.StateRegistry.UNKNOWN:
        if env.replica_rank() == 0:
            # The first State of the process: an unwritable path is found now, before
            # training, also where init_process_group (which checks it too) was not used.
            check_checkpoint_root(env.checkpoint_path())
        registry.restore_dir = latest_checkpoint_dir()
        if registry.restore_dir is not None:
            LOG.info("restoring states from %s", registry.restore_dir)
    return registry.restore_dir


def load_state(state: State) -> bool:
    """Load ``state`` from the checkpoint this job restarted from, if it holds one.

    Returns:
        True if the state was found and loaded, False otherwise (first run, no checkpoint
        path, or a state the checkpoint's manifest does not list).

    Raises:
        CheckpointError: if no intact checkpoint is left, if the state's file is listed
            but missing or does not match its size and CRC-32, or if ``state.load``
            fails on it (the message names the file).
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
        manifest = _read_manifest(ckpt)
        if state.name not in manifest["states"]:
            return False  # the state did not exist when the checkpoint was taken
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if os.path.isdir(ckpt):
            raise CheckpointError(f"{path} is missing, but the manifest lists it: the "
                                  "checkpoint is damaged") from None
        # Removed between the check and the open: look again.
        registry.restore_dir = context.StateRegistry.UNKNOWN
        return load_state(state)
    # The whole checkpoint was verified when it was chosen; these exact bytes are checked
    # again so that damage in between is never loaded.
    _check_bytes(path, data, (manifest.get("files") or {}).get(state.name))
    try:
        state.load(io.BytesIO(data))
    except Exception as exc:
        raise CheckpointError(_load_failure(path, exc)) from exc
    return True


def _load_failure(path: str, exc: BaseException) -> str:
    text = str(exc).strip()
    if "weights_only" in text or not text:
        # torch's unpickling advice (weights_only=False) is wrong here: the bytes are
        # not what the State saved, so loading them less safely would not help.
        text = "its content is not what the State saved (damaged or written by another program)"
    else:
        text = text.splitlines()[0]
    return f"could not load {path} ({type(exc).__name__}): {text}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_state_file(directory: str, state: State) -> dict:
    """Write ``state`` into ``directory``; returns its manifest entry (size, CRC-32)."""
    # Serialise to memory first so that a failing save() never leaves a partial file.
    buf = io.BytesIO()
    state.save(buf)
    data = buf.getvalue()
    with open(os.path.join(directory, state.name), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return _file_entry(data)


def _carry_over(tmp: str, source: str | None, names: list[str],
                entries: dict[str, dict], summaries: dict[str, Any]) -> None:
    """Hard-link into ``tmp`` the states of ``source`` that ``tmp`` lacks (in place, the
    names list, entries and summaries grow), so that a checkpoint keeps states this run
    has not re-created."""
    if source is None or not os.path.isdir(source):
        return
    manifest = _read_manifest(source)
    listed = manifest.get("files") or {}
    carried_summaries = manifest.get("summary")
    for name in manifest["states"]:
        if name in names:
            continue
        if isinstance(carried_summaries, dict) and name in carried_summaries:
            summaries[name] = carried_summaries[name]
        path = os.path.join(source, name)
        # Hard links make this copy free; checkpoint files are never modified in place.
        os.link(path, os.path.join(tmp, name))
        names.append(name)
        entries[name] = listed.get(name) or {"size": os.stat(path).st_size,
                                             "crc32": _file_crc32(path)}


def _move_restore_point(final: str) -> None:
    # The new checkpoint holds (carried over) every state of the old restore point that
    # this run has not created yet, so later loads may read from it.
    registry = _registry()
    if registry.restore_dir is not context.StateRegistry.UNKNOWN \
            and registry.restore_dir is not None:
        registry.restore_dir = final


def _newest_intact(dirs: list[tuple[int, str]]) -> str | None:
    for _, path in reversed(dirs):
        try:
            verify_checkpoint(path)
        except (CheckpointError, FileNotFoundError) as exc:
            LOG.warning("removing damaged checkpoint %s: %s", path, exc)
            continue
        return path
    return None


def _remove_checkpoint(root: str, path: str) -> None:
    # Renamed away first, so that readers never see a half-removed checkpoint-<seq>
    # (which would look damaged); the leftover is a .tmp- directory, cleaned like others.
    doomed = os.path.join(root, f".tmp-removed-{os.path.basename(path)}-{os.getpid()}")
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path
    shutil.rmtree(doomed, ignore_errors=True)


def _summaries(states: list[State]) -> dict[str, Any]:
    """The :meth:`State.summary` of every state that gives one, by name."""
    found = {}
    for state in states:
        summary = state.summary()
        if summary is not None:
            found[state.name] = summary
    return found


def _commit(root: str, tmp: str, names: list[str], entries: dict[str, dict],
            summaries: dict[str, Any]) -> str:
    """Write the manifest, then rename ``tmp`` into place as the next checkpoint."""
    _carry_over(tmp, _restore_dir(), names, entries, summaries)
    with open(os.path.join(tmp, _MANIFEST), "w") as f:
        json.dump({"format": _FORMAT, "states": names,
                   "files": {name: entries[name] for name in names},
                   "summary": summaries,
                   "time": time.time(), "num_restarts": env.num_restarts(),
                   "num_replicas": env.num_replicas()}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    existing = _checkpoint_dirs(root)
    seq = existing[-1][0] + 1 if existing else 0
    final = os.path.join(root, f"{_CKPT_PREFIX}{seq}")
    os.rename(tmp, final)
    _fsync_dir(root)
    # Read back before anything older goes: a checkpoint that cannot be verified now
    # must not replace the ones we still have (they stay; the error propagates).
    verify_checkpoint(final)
    _move_restore_point(final)
    # The newest older intact checkpoint stays as a fallback in case this one is damaged
    # later; the rest (older or damaged) go.
    keep = _newest_intact(existing)
    for _, old in existing:
        if old != keep:
            _remove_checkpoint(root, old)
    for entry in os.listdir(root):
        if entry.startswith(".tmp-") and os.path.join(root, entry) != tmp:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return final


def check_checkpoint_root(root: str | os.PathLike | None) -> None:
    """Check, before training starts, that checkpoints can be written under ``root``
    (``None``: no checkpoints, nothing to check): the directory is created if missing
    and a probe file is written and removed, so an unwritable path fails now rather
    than at the first checkpoint, after the training it was to save.

    Raises:
        ValueError: naming the path and the operating system's reason.
    """
    if root is None:
        return
    root = os.fspath(root)
    try:
        os.makedirs(root, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=root)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise ValueError(f"ADAPTDL_CHECKPOINT_PATH={root!r} cannot hold checkpoints "
                         f"({exc.strerror or exc}); set it to a writable directory, or "
                         "unset it to run without checkpoints") from None


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
    entries: dict[str, dict] = {}
    try:
        for state in states:
            entries[state.name] = _write_state_file(tmp, state)
        total = sum(e["size"] for e in entries.values())
        final = _commit(root, tmp, [s.name for s in states], entries, _summaries(states))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # (The one line that names the new checkpoint: callers say why it was taken.)
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
        entries = {state.name: _write_state_file(tmp, state)}
        summaries = _summaries([state])
        _carry_over(tmp, latest_checkpoint_dir(root), names, entries, summaries)
        final = _commit(root, tmp, names, entries, summaries)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    LOG.info("saved state %s to %s (the others carried over)", state.name, final)
    return final


def dump_json(obj: Any, fileobj: IO[bytes]) -> None:
    """Write ``obj`` as UTF-8 JSON into a binary file object (for simple States)."""
    fileobj.write(json.dumps(obj).encode("utf-8"))


def load_json(fileobj: IO[bytes]) -> Any:
    """Read UTF-8 JSON from a binary file object (the inverse of :func:`dump_json`)."""
    return json.loads(fileobj.read().decode("utf-8"))
