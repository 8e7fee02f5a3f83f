"""Joining the job: the collective store plus a torch.distributed process group."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from adaptdl_core import checkpoint, collective, context, env
from adaptdl_core.torch import _interrupt

__all__ = ["init_process_group"]

LOG = logging.getLogger(__name__)


def _parse_init_method(init_method: str | None) -> tuple[str | None, int | None]:
    if init_method is None or init_method == "env://":
        return None, None
    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or url.port is None:
        raise ValueError(f"init_process_group(init_method={init_method!r}): use "
                         "'tcp://<master address>:<port>', 'env://' or None (then the "
                         "ADAPTDL_MASTER_ADDR/ADAPTDL_MASTER_PORT variables are used)")
    return url.hostname, url.port


def init_process_group(backend: str, init_method: str | None = None,
                       world_size: int | None = None, rank: int | None = None) -> None:
    """Join this replica to the job: start the job context (:mod:`adaptdl_core.context`)
    with the job's world, install the graceful-stop signal handlers, connect to the job's
    store and initialise ``torch.distributed`` with ``backend``.

    Without arguments everything comes from the ``ADAPTDL_*`` variables, and a single
    process needs none of them. Under torchrun its own variables stand in for unset ones
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...; see :mod:`adaptdl_core.env`), so an
    unchanged script runs under ``torchrun --nproc-per-node=K`` as well.

    Arguments:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPU), as for torch.distributed.
        init_method: ``"tcp://addr:port"`` of replica 0's store, or None/``"env://"``
            for ``ADAPTDL_MASTER_ADDR``/``ADAPTDL_MASTER_PORT``.
        world_size: number of replicas (default ``ADAPTDL_NUM_REPLICAS``, else 1).
        rank: this replica's rank (default ``ADAPTDL_REPLICA_RANK``, else 0).

    Raises:
        ValueError: for an invalid backend, init method, rank or world size, or (on
            replica 0) an ``ADAPTDL_CHECKPOINT_PATH`` that is empty or not writable.
        RuntimeError: if already initialised, or if torch.distributed fails to connect
            the replicas after they all joined.
        adaptdl_core.collective.RendezvousTimeoutError: if some replicas do not join
            within ``ADAPTDL_TIMEOUT`` seconds (the message names them: "replica 2 of 3
            never joined within 30 s (joined: 0, 1; ...)"); every replica that waited
            raises it, within the timeout plus about two seconds.
    """
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"init_process_group(backend={backend!r}): pass 'gloo' or 'nccl'")
    if dist.is_initialized() or collective.is_initialized():
        raise RuntimeError("init_process_group() was already called in this process")
    addr, port = _parse_init_method(init_method)
    size = env.num_replicas() if world_size is None else world_size
    rank = env.replica_rank() if rank is None else rank
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"init_process_group(world_size={size!r}): must be an integer >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"init_process_group(rank={rank!r}): must be an integer in [0, {size})")
    if rank == 0:
        # Only replica 0 writes checkpoints; found now, not after the training it was
        # to save (the other replicas then time out naming replica 0).
        checkpoint.check_checkpoint_root(env.checkpoint_path())
    # The rest of the library reads the shape of the job from the environment.
    os.environ["ADAPTDL_NUM_REPLICAS"] = str(size)
    os.environ["ADAPTDL_REPLICA_RANK"] = str(rank)
    if env.num_nodes() > size:
        os.environ["ADAPTDL_NUM_NODES"] = str(size)
    context.start(context.World(env.num_nodes(), size, rank, env.num_restarts()))
    _interrupt.install_signal_handlers()
    timeout = timedelta(seconds=env.timeout())
    if size == 1:
        # One replica: collectives are local and torch needs only an in-memory store.
        store: dist.Store = dist.HashStore()
    else:
        collective.initialize(addr, port, rank, size)
        store = dist.PrefixStore("adaptdl/torch", collective.new_store_client())
    if backend == "nccl" and torch.cuda.is_available():
        local_rank = env.local_rank()
        if local_rank is None:
            local_rank = rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=timeout)
    except Exception as exc:
        if size == 1:
            raise
        # Every replica had joined the collective rendezvous, so one left (or hangs)
        # in the short window since; replica 0 must not then wait another timeout at
        # exit for the others to leave.
        collective.teardown(wait=False)
        raise RuntimeError(
            f"replica {rank} of {size}: torch.distributed ({backend}) could not connect the "
            f"replicas although all {size} had joined: a peer likely exited or hangs. "
            f"torch said: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
        ) from exc
    LOG.info("replica %d of %d joined (backend %s, restart %d)", rank, size, backend,
             env.num_restarts())
