"""The ``ADAPTDL_*`` environment variables that describe one replica of an elastic job.

A launcher (a shell, a test harness, or the Ray trainable) sets these before the training
script starts. A single process needs none of them: every function has a default that
describes a one-replica job with no checkpointing.

=========================== ======================== ============================
variable                    function                 default
=========================== ======================== ============================
``ADAPTDL_CHECKPOINT_PATH`` :func:`checkpoint_path`  ``None`` (no checkpoints)
``ADAPTDL_SHARE_PATH``      :func:`share_path`       ``None``
``ADAPTDL_JOB_ID``          :func:`job_id`           ``None``
``ADAPTDL_MASTER_ADDR``     :func:`master_addr`      ``"127.0.0.1"``
``ADAPTDL_MASTER_PORT``     :func:`master_port`      ``0`` (pick a free port)
``ADAPTDL_MASTER_FD``       :func:`master_fd`        ``None``
``ADAPTDL_REPLICA_RANK``    :func:`replica_rank`     ``0``
``ADAPTDL_NUM_REPLICAS``    :func:`num_replicas`     ``1``
``ADAPTDL_NUM_NODES``       :func:`num_nodes`        ``num_replicas()``
``ADAPTDL_NUM_RESTARTS``    :func:`num_restarts`     ``0``
``ADAPTDL_TIMEOUT``         :func:`timeout`          ``30`` seconds
=========================== ======================== ============================

Values are read on every call (not cached) so that tests and launchers can change them;
invalid values raise :class:`ValueError` naming the variable and what is expected. An
empty value means the default, except for ``ADAPTDL_CHECKPOINT_PATH``, where it is
refused (a job meant to checkpoint would otherwise silently save nothing).

**Under torchrun** (``python -m torch.distributed.run``, detected by its
``TORCHELASTIC_RUN_ID``), an unset (or empty) ``ADAPTDL_*`` variable falls back to
torchrun's own:

=========================== ===================================
``ADAPTDL_*`` variable      torchrun's variable
=========================== ===================================
``ADAPTDL_MASTER_ADDR``     ``MASTER_ADDR``
``ADAPTDL_MASTER_PORT``     ``MASTER_PORT``
``ADAPTDL_REPLICA_RANK``    ``RANK``
``ADAPTDL_NUM_REPLICAS``    ``WORLD_SIZE``
``ADAPTDL_NUM_NODES``       ``GROUP_WORLD_SIZE`` (agents)
``ADAPTDL_NUM_RESTARTS``    ``TORCHELASTIC_RESTART_COUNT``
(none)                      ``LOCAL_RANK`` (:func:`local_rank`)
=========================== ===================================

An ``ADAPTDL_*`` variable that is set always wins. Outside torchrun the plain names are
ignored (other launchers, Ray's workers among them, set ``MASTER_ADDR`` for their own
purposes). When torchrun's agent hosts the store the workers share
(``TORCHELASTIC_USE_AGENT_STORE=True``, its default) and ``ADAPTDL_MASTER_PORT`` is unset,
replica 0 publishes its own store's port in that store (:func:`shared_store_scope`).
"""

from __future__ import annotations

import os

from adaptdl_core import validation

__all__ = [
    "checkpoint_path",
    "share_path",
    "job_id",
    "master_addr",
    "master_port",
    "master_fd",
    "replica_rank",
    "num_replicas",
    "num_nodes",
    "num_restarts",
    "timeout",
    "local_rank",
    "under_torchrun",
    "shared_store_scope",
]

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: beyond that a wait is a hang, not a timeout


# torchrun's name for each ADAPTDL_* variable it also sets (see the module docstring).
_TORCHRUN_NAMES = {
    "ADAPTDL_MASTER_ADDR": "MASTER_ADDR",
    "ADAPTDL_MASTER_PORT": "MASTER_PORT",
    "ADAPTDL_REPLICA_RANK": "RANK",
    "ADAPTDL_NUM_REPLICAS": "WORLD_SIZE",
    "ADAPTDL_NUM_NODES": "GROUP_WORLD_SIZE",
    "ADAPTDL_NUM_RESTARTS": "TORCHELASTIC_RESTART_COUNT",
}


def under_torchrun() -> bool:
    """True in a worker started by torchrun (its ``TORCHELASTIC_RUN_ID`` is set)."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID", "").strip())


def _source(name: str) -> str:
    """The variable that gives ``name``'s value: ``name`` itself when set, else its
    torchrun counterpart when running under torchrun and that one is set."""
    if os.environ.get(name, "").strip() or not under_torchrun():
        return name
    other = _TORCHRUN_NAMES.get(name)
    return other if other and os.environ.get(other, "").strip() else name


def _get_int(name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    """The integer variable ``name`` (or its torchrun twin), ``default`` if unset.

    Raises:
        ValueError: naming the variable, if it is not an integer in ``[minimum, maximum]``.
    """
    name = _source(name)
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set it to an integer >= {minimum} "
                         f"or unset it (default {default})") from None
    return validation.integer(name, value, minimum, maximum)


def _get_str(name: str) -> str | None:
    raw = os.environ.get(_source(name))
    return raw if raw else None


def checkpoint_path() -> str | None:
    """Directory where checkpoints are written and read (``ADAPTDL_CHECKPOINT_PATH``).

    Returns ``None`` when unset: the job then neither loads nor saves checkpoints.

    Raises:
        ValueError: if the variable is set but empty (or blank): unlike the other
            variables, an empty value is not taken as the default, since a job that
            meant to checkpoint would then stop ("checkpointed") having saved nothing.
    """
    raw = os.environ.get("ADAPTDL_CHECKPOINT_PATH")
    if raw is not None and not raw.strip():
        raise ValueError(f"ADAPTDL_CHECKPOINT_PATH={raw!r} is set but empty: set it to the "
                         "directory to checkpoint into, or unset it to run without "
                         "checkpoints")
    return raw


def share_path() -> str | None:
    """Directory shared by all replicas and restarts of the job (``ADAPTDL_SHARE_PATH``),
    for example for a dataset cache. ``None`` when unset."""
    return _get_str("ADAPTDL_SHARE_PATH")


def job_id() -> str | None:
    """Identifier of the job (``ADAPTDL_JOB_ID``), ``None`` when unset."""
    return _get_str("ADAPTDL_JOB_ID")


def master_addr() -> str:
    """Address of replica 0, which hosts the rendezvous store (``ADAPTDL_MASTER_ADDR``).

    Defaults to ``127.0.0.1``.
    """
    return _get_str("ADAPTDL_MASTER_ADDR") or "127.0.0.1"


def master_port() -> int:
    """TCP port of the rendezvous store on replica 0 (``ADAPTDL_MASTER_PORT``).

    Defaults to 0, which lets a single-replica job pick any free port. A multi-replica job
    must set it.

    Raises:
        ValueError: if the value is not an integer in [0, 65535].
    """
    return _get_int("ADAPTDL_MASTER_PORT", 0, 0, 65535)


def master_fd() -> int | None:
    """File descriptor of a socket bound to the master port, inherited from the launcher,
    which replica 0's store listens on (``ADAPTDL_MASTER_FD``; see
    :mod:`adaptdl_core.ports`). ``None`` when unset: the store binds the port itself.

    Raises:
        ValueError: if the value is not an integer >= 0.
    """
    raw = os.environ.get("ADAPTDL_MASTER_FD")
    if raw is None or raw.strip() == "":
        return None
    return _get_int("ADAPTDL_MASTER_FD", 0, 0)


def num_replicas() -> int:
    """Number of replicas (processes) in the job (``ADAPTDL_NUM_REPLICAS``), default 1.

    Raises:
        ValueError: if the value is not an integer >= 1.
    """
    return _get_int("ADAPTDL_NUM_REPLICAS", 1, 1)


def replica_rank() -> int:
    """Rank of this replica, in ``[0, num_replicas())`` (``ADAPTDL_REPLICA_RANK``), default 0.

    Raises:
        ValueError: if the value is not an integer, is negative, or is >= num_replicas().
    """
    rank = _get_int("ADAPTDL_REPLICA_RANK", 0, 0)
    replicas = num_replicas()
    if rank >= replicas:
        raise ValueError(f"{_source('ADAPTDL_REPLICA_RANK')}={rank} must be < "
                         f"{_source('ADAPTDL_NUM_REPLICAS')}={replicas}")
    return rank


def num_nodes() -> int:
    """Number of distinct machines the replicas run on (``ADAPTDL_NUM_NODES``).

    Defaults to :func:`num_replicas` (the conservative assumption of one replica per node).

    Raises:
        ValueError: if the value is not an integer in [1, num_replicas()].
    """
    replicas = num_replicas()
    nodes = _get_int("ADAPTDL_NUM_NODES", replicas, 1)
    if nodes > replicas:
        raise ValueError(f"{_source('ADAPTDL_NUM_NODES')}={nodes} must be <= "
                         f"{_source('ADAPTDL_NUM_REPLICAS')}={replicas}")
    return nodes


def num_restarts() -> int:
    """How many times the job has been restarted so far (``ADAPTDL_NUM_RESTARTS``), default 0.

    Raises:
        ValueError: if the value is not an integer >= 0.
    """
    return _get_int("ADAPTDL_NUM_RESTARTS", 0, 0)


def timeout() -> float:
    """Seconds any distributed wait may block before failing (``ADAPTDL_TIMEOUT``), default 30.

    Raises:
        ValueError: if the value is not a positive number.
    """
    raw = os.environ.get("ADAPTDL_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"ADAPTDL_TIMEOUT={raw!r} is not a number of seconds") from None
    return validation.number("ADAPTDL_TIMEOUT", value, 0.0, MAX_TIMEOUT_S, low_open=True,
                             what="a finite number of seconds")


def local_rank() -> int | None:
    """This process's rank among the job's processes on its machine (``LOCAL_RANK``, as
    torchrun sets it), or ``None`` when unset (then the caller decides, e.g. from the
    rank and the device count).

    Raises:
        ValueError: if the value is not an integer >= 0.
    """
    if not os.environ.get("LOCAL_RANK", "").strip():
        return None
    return _get_int("LOCAL_RANK", 0, 0)


def shared_store_scope() -> str | None:
    """Whether :func:`master_addr` / :func:`master_port` name a launcher's store, and the
    key scope the job uses there.

    ``None`` (the usual case): replica 0 hosts the job's store at that port. Under
    torchrun with ``TORCHELASTIC_USE_AGENT_STORE=True`` (its default) and
    ``ADAPTDL_MASTER_PORT`` unset, torchrun's agent already hosts a store there: the
    result is then ``"torchrun/<run id>"``, under which replica 0 publishes where its own
    store is (:mod:`adaptdl_core.collective`).
    """
    if (not under_torchrun() or os.environ.get("ADAPTDL_MASTER_PORT", "").strip()
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") != "True"):
        return None
    return f"torchrun/{os.environ['TORCHELASTIC_RUN_ID'].strip()}"
