"""Every use of Ray internals by adaptdl_ray, in one place, checked against the Ray version.

Ray 2.60 has no public seam for four things AdaptDL needs:

* **The replica's Tune context.** ``tune.report``, ``tune.get_checkpoint`` and
  ``tune.get_context()`` read a process-wide session object
  (``ray.train._internal.session``); Ray installs one only in its own function
  trainables. A replica of an AdaptDL trial is an actor of ours, so it installs a session of
  its own (:func:`install_replica_session`). With Ray Train V2 enabled (the default),
  ``ray.train.get_context()`` / ``ray.train.report`` read V2's function utilities instead,
  which :func:`install_replica_session` sets up too.
* **The trial's storage.** A class trainable gets a ``StorageContext`` (the trial directory
  on the run's storage filesystem) but no public accessor for it: :func:`trial_storage`.
* **The trainable's iteration and time counters**, which Tune restores only from its own
  checkpoints: :func:`set_trainable_counters` (used when a trial resumes from the state it
  saved on an interrupted run, which Tune does not know about).
* **What each node has free**, which the cluster allocator subtracts from the nodes'
  totals to leave out what other work holds (``ray.available_resources()`` only gives
  the sum over nodes): :func:`available_resources_per_node`.
* **Which nodes are draining**, and their deadlines (a node Ray's autoscaler or
  ``ray drain-node`` is about to take away, e.g. a spot node given its preemption
  notice): :func:`draining_nodes`. Ray's own libraries read it the same way.

Everything here is checked at import, the Tune internals at the import of the Tune
modules that use them: a Ray outside the tested range logs a warning, and a Ray whose
internals moved raises :class:`ImportError` naming what is missing, rather than failing
later inside a trial (:func:`check_ray`, tested in ``tests/ray/test_ray_private.py``);
``tests/ray/test_trial_files_unit.py`` exercises each seam.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import ray

LOG = logging.getLogger(__name__)

__all__ = ["TESTED_RAY", "StorageInfo", "check_ray", "check_tune", "install_replica_session",
           "clear_replica_session", "trial_storage", "set_trainable_counters",
           "available_resources_per_node", "draining_nodes"]

# The Ray versions these seams were read from and tested with ([low, high)).
TESTED_RAY = ((2, 60), (2, 61))


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def check_ray(*, tune: bool = True) -> None:
    """Check the installed Ray: log a warning if its version is outside
    :data:`TESTED_RAY`, and check that every internal used here is present.

    Args:
        tune: also check the Tune and Train internals (the replica's session, the
            trainable's counters). That imports ``ray.tune`` and ``ray.train``, about a
            second of CPU, which a process that only reads node state (the cluster
            allocator's actor) does not otherwise pay: at import this module checks the
            node-state internals only, and the Tune modules (:mod:`.trainable`,
            :mod:`.scheduler`, :mod:`.worker`) call :func:`check_tune` at theirs.

    Raises:
        ImportError: an internal this module uses is gone (names each one and the Ray to
            install).
    """
    found = _version_tuple(ray.__version__)
    if not TESTED_RAY[0] <= found < TESTED_RAY[1]:
        LOG.warning("adaptdl_ray was tested with Ray %d.%d; this is Ray %s. If AdaptDL trials "
                    "misbehave, install ray[tune]==2.60.*", *TESTED_RAY[0], ray.__version__)
    missing = _missing_tune_internals() if tune else []
    from ray._private import state as ray_state
    if not callable(getattr(ray_state, "available_resources_per_node", None)):
        missing.append("ray._private.state.available_resources_per_node")
    if not callable(getattr(getattr(ray_state, "GlobalState", None), "get_draining_nodes",
                            None)):
        missing.append("ray._private.state.GlobalState.get_draining_nodes")
    if missing:
        raise ImportError(
            f"adaptdl_ray needs Ray internals that Ray {ray.__version__} does not have "
            f"({', '.join(missing)}); install a tested Ray: pip install 'ray[tune]==2.60.*'")


def _missing_tune_internals() -> list[str]:
    from ray.train._internal import session as train_session
    from ray.tune.trainable import Trainable
    missing = [name for name in ("_session", "get_session") if not hasattr(train_session, name)]
    for name in ("_iteration", "_time_total", "_storage"):
        if name not in Trainable.__init__.__code__.co_names:
            missing.append(f"Trainable.{name}")
    return missing


_TUNE_CHECKED = False


def check_tune() -> None:
    """:func:`check_ray` with the Tune and Train internals, once per process.

    Raises:
        ImportError: as :func:`check_ray`."""
    global _TUNE_CHECKED
    if not _TUNE_CHECKED:
        check_ray(tune=True)
        _TUNE_CHECKED = True


check_ray(tune=False)


# -- the replica's session ------------------------------------------------------------------
class ReplicaSession:
    """What Ray's session readers find in a replica: trial and world facts, and ``report``.

    Attribute names are the ones ``ray.train._internal.session`` reads (``world_rank``
    set to an int also makes ``get_world_rank`` and friends work, as in Ray Train).

    Args:
        report_fn: called as ``report_fn(metrics, checkpoint)`` for every report.
        trial: ``trial_name``, ``trial_id``, ``experiment_name``, ``trial_resources``,
            ``trial_dir``.
        world: ``world_rank``, ``world_size``, ``local_rank``, ``local_world_size``,
            ``node_rank``.
        loaded_checkpoint: what ``tune.get_checkpoint()`` returns (a ``tune.Checkpoint`` of
            the user's files the trial resumed from, or ``None``).
    """

    def __init__(self, report_fn: Callable[[dict, Any], None], trial: dict[str, Any],
                 world: dict[str, int], loaded_checkpoint: Any = None) -> None:
        self._report_fn = report_fn
        self.trial_name = trial.get("trial_name")
        self.trial_id = trial.get("trial_id")
        self.run_id = trial.get("trial_id")
        self.experiment_name = trial.get("experiment_name")
        self.trial_resources = trial.get("trial_resources")
        self.trial_dir = trial.get("trial_dir")
        self.world_rank = int(world["world_rank"])
        self.world_size = int(world["world_size"])
        self.local_rank = int(world["local_rank"])
        self.local_world_size = int(world["local_world_size"])
        self.node_rank = int(world["node_rank"])
        self.loaded_checkpoint = loaded_checkpoint
        self.metadata = {}
        self.storage = None

    def report(self, metrics: dict, checkpoint: Any = None, **_: Any) -> None:
        """Forward a report (``tune.report`` / ``ray.train.report``) to the replica."""
        self._report_fn(metrics, checkpoint)


def _install_train_v2(session: ReplicaSession) -> None:
    """Route ``ray.train.get_context()`` / ``ray.train.report`` (Train V2) to ``session``."""
    from ray.train.v2._internal.constants import is_v2_enabled
    if not is_v2_enabled():
        return
    from ray.train.v2._internal.execution import train_fn_utils

    class _ReplicaTrainFnUtils(train_fn_utils.LocalTrainFnUtils):
        def report(self, metrics, checkpoint=None, *args, **kwargs):  # noqa: D401
            session.report(metrics, checkpoint)

        def get_checkpoint(self):
            return session.loaded_checkpoint

    train_fn_utils.set_train_fn_utils(_ReplicaTrainFnUtils(
        experiment_name=session.experiment_name or "", world_size=session.world_size,
        world_rank=session.world_rank, local_rank=session.local_rank,
        local_world_size=session.local_world_size, node_rank=session.node_rank))


def install_replica_session(session: ReplicaSession) -> None:
    """Make ``tune.report`` / ``tune.get_context()`` (and, under Train V2,
    ``ray.train.report`` / ``ray.train.get_context()``) in this process use ``session``.

    Raises:
        ImportError: as :func:`check_tune`."""
    check_tune()
    from ray.train._internal import session as train_session
    train_session._session = session
    try:
        _install_train_v2(session)
    except (ImportError, AttributeError, TypeError) as exc:  # Train V2 internals moved
        LOG.warning("ray.train.get_context() will not work inside AdaptDL replicas (%s); "
                    "use ray.tune.get_context()", exc)


def clear_replica_session() -> None:
    """Remove the session installed by :func:`install_replica_session` (idempotent)."""
    from ray.train._internal import session as train_session
    train_session._session = None
    try:
        from ray.train.v2._internal.execution import train_fn_utils
        train_fn_utils.set_train_fn_utils(None)
    except (ImportError, AttributeError):
        pass


# -- the trial's storage ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StorageInfo:
    """Where a trial's files persist.

    Attributes:
        filesystem: the run's ``pyarrow.fs.FileSystem``.
        trial_fs_path: the trial directory on it (results, checkpoints).
        trial_dir: the local trial directory Ray's function trainables report as
            ``get_trial_dir()`` (on the driver's node).
        experiment_name: the experiment's directory name.
    """

    filesystem: Any
    trial_fs_path: str
    trial_dir: str | None
    experiment_name: str | None


def trial_storage(trainable: Any) -> StorageInfo | None:
    """The storage of a running Tune trainable, or ``None`` outside Tune (no storage)."""
    storage = getattr(trainable, "_storage", None)
    if storage is None:
        return None
    return StorageInfo(storage.storage_filesystem, storage.trial_fs_path,
                       getattr(storage, "trial_driver_staging_path", None),
                       getattr(storage, "experiment_dir_name", None))


def set_trainable_counters(trainable: Any, *, iteration: int, time_total_s: float) -> None:
    """Set a trainable's ``training_iteration`` and ``time_total_s`` counters (Tune sets them
    only from its own checkpoints' metrics).

    Raises:
        ValueError: for a negative iteration or time.
    """
    if iteration < 0 or not time_total_s >= 0:
        raise ValueError(f"counters must be >= 0, got iteration={iteration}, "
                         f"time_total_s={time_total_s}")
    trainable._iteration = int(iteration)
    trainable._time_total = float(time_total_s)


# -- each node's free resources -----------------------------------------------------------
def available_resources_per_node() -> dict[str, dict[str, float]]:
    """node id (hex) -> resource name -> amount free now, for every alive node (Ray's own
    accounting: placement-group reservations count as used). Needs a connected Ray."""
    from ray._private import state as ray_state
    return {str(node): {str(k): float(v) for k, v in resources.items()}
            for node, resources in ray_state.available_resources_per_node().items()}


# -- nodes being drained --------------------------------------------------------------------
def draining_nodes() -> dict[str, float | None]:
    """node id (hex) -> the drain's deadline (seconds since the epoch; ``None``: no
    deadline) for every node Ray is draining now. Needs a connected Ray."""
    from ray._private import state as ray_state
    return {str(node): (float(deadline_ms) / 1000.0 if deadline_ms else None)
            for node, deadline_ms in ray_state.state.get_draining_nodes().items()}
