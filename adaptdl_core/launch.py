"""Start the replicas of one standalone job on this machine with the ``ADAPTDL_*`` variables.

From the shell::

    python -m adaptdl_core.launch --replicas 2 --checkpoint-path /tmp/ckpt train.py --lr 0.1

starts ``train.py`` twice (ranks 0 and 1) with a free master port (held from the moment it
is picked until replica 0's store listens on it: see :mod:`adaptdl_core.ports`), waits for
both, and
exits with their status: 0 when all finished, 143 when all were checkpointed and stopped
(Ctrl-C reaches every replica of the terminal's process group), else the first failure.
Run the same command again, with any ``--replicas``, to resume: the restart count comes
from the newest checkpoint (``--restarts`` overrides it). Once the job has finished, its
newest checkpoint is the end of training and says so; running the command again then
trains nothing (the script's ``remaining_epochs_until`` logs ``job already finished``)
and exits 0.

From Python (tests, benchmarks, other launchers): :func:`replica_env`,
:func:`start_replicas` and :func:`wait_replicas`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from adaptdl_core import checkpoint, ports, validation

__all__ = ["replica_env", "start_replicas", "wait_replicas", "job_status",
           "ResumePoint", "resume_point", "restarts_for", "end_line", "main"]

LOG = logging.getLogger(__name__)

# The epoch counter's State (adaptdl_core.torch.epoch.EPOCH_STATE_NAME), whose summary in
# a manifest says whether training finished; not imported from there, which would import
# torch into the launcher.
_EPOCH_STATE = "adaptdl-epoch"


def replica_env(rank: int, num_replicas: int, master_port: int, *,
                master_addr: str = "127.0.0.1", checkpoint_path: str | Path | None = None,
                num_restarts: int = 0, extra_env: Mapping[str, str] | None = None,
                base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of replica ``rank``: ``base_env`` (default: this process's),
    the ``ADAPTDL_*`` variables of the job, then ``extra_env``.

    Raises:
        ValueError: if ``num_replicas`` is not an integer ``>= 1``, ``rank`` one in
            ``[0, num_replicas)``, ``master_port`` one in ``[0, 65535]`` or ``num_restarts``
            one ``>= 0``.
    """
    num_replicas = validation.integer("num_replicas", num_replicas, 1)
    rank = validation.integer("rank", rank, 0, num_replicas - 1)
    master_port = validation.integer("master_port", master_port, 0, 65535)
    num_restarts = validation.integer("num_restarts", num_restarts, 0)
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        "ADAPTDL_MASTER_ADDR": master_addr,
        "ADAPTDL_MASTER_PORT": str(master_port),
        "ADAPTDL_REPLICA_RANK": str(rank),
        "ADAPTDL_NUM_REPLICAS": str(num_replicas),
        "ADAPTDL_NUM_RESTARTS": str(num_restarts),
    })
    if checkpoint_path is not None:
        env["ADAPTDL_CHECKPOINT_PATH"] = str(checkpoint_path)
    env.update(extra_env or {})
    return env


def start_replicas(command: Sequence[str], num_replicas: int, *,
                   checkpoint_path: str | Path | None = None, num_restarts: int = 0,
                   master_port: int | None = None, extra_env: Mapping[str, str] | None = None,
                   capture_output: bool = False, cwd: str | Path | None = None
                   ) -> list[subprocess.Popen]:
    """Start ``num_replicas`` processes running ``command``, rank 0 first.

    Arguments:
        command: the program and its arguments, e.g. ``[sys.executable, "train.py"]``.
        num_replicas: how many replicas (>= 1).
        checkpoint_path: ``ADAPTDL_CHECKPOINT_PATH`` for all replicas (None: not set).
        num_restarts: ``ADAPTDL_NUM_RESTARTS`` (increase it on every restart).
        master_port: the store port on rank 0 (default: a free one, held for rank 0's
            store: rank 0 inherits the bound socket, see :mod:`adaptdl_core.ports`).
        extra_env: more variables for every replica.
        capture_output: collect stdout and stderr together (text) instead of inheriting.
        cwd: working directory of the replicas.

    Raises:
        ValueError: for an empty command or ``num_replicas < 1``.
    """
    if not command:
        raise ValueError("start_replicas(command=...): the command is empty")
    num_replicas = validation.integer("num_replicas", num_replicas, 1)
    held = ports.HeldPort() if master_port is None else None
    port = held.port if held is not None else master_port
    output = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) \
        if capture_output else {}
    procs = []
    try:
        for rank in range(num_replicas):
            env = replica_env(rank, num_replicas, port, checkpoint_path=checkpoint_path,
                              num_restarts=num_restarts, extra_env=extra_env)
            inherit: tuple[int, ...] = ()
            if held is not None and rank == 0:
                env.update(held.env())
                inherit = (held.fileno(),)
            procs.append(subprocess.Popen(list(command), cwd=cwd, **output, env=env,
                                          pass_fds=inherit))
            if held is not None:
                held.close()  # (rank 0 holds its own copy now)
                held = None
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    finally:
        if held is not None:
            held.close()
    return procs


def wait_replicas(procs: Sequence[subprocess.Popen], timeout: float | None = None
                  ) -> list[tuple[int, str | None]]:
    """Wait for every replica; returns ``(exit status, captured output or None)`` per rank.

    A replica still running ``timeout`` seconds into its wait is killed, and its output
    ends with a line saying so.
    """
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            if out is not None:
                out += f"\n<killed by the launcher after {timeout:g} s>"
        results.append((proc.returncode, out))
    return results


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """What the newest intact checkpoint of a job says about resuming it.

    Attributes:
        path: the checkpoint directory.
        restarts: the restart count of the run that wrote it (the next run is
            ``restarts + 1``).
        finished_epochs: epochs finished when it was written (``None``: not recorded).
        finished: it is the end of training (an epoch loop ran to its bound).
    """

    path: str
    restarts: int
    finished_epochs: int | None
    finished: bool


def resume_point(checkpoint_path: str | Path | None) -> ResumePoint | None:
    """The :class:`ResumePoint` of the newest intact checkpoint under
    ``checkpoint_path``, or ``None`` when there is none (or no path).

    Raises:
        adaptdl_core.checkpoint.CheckpointError: every checkpoint there is damaged.
    """
    if checkpoint_path is None:
        return None
    path = checkpoint.latest_checkpoint_dir(checkpoint_path)
    if path is None:
        return None
    manifest = checkpoint.verify_checkpoint(path)
    restarts = manifest.get("num_restarts")
    summary = (manifest.get("summary") or {}).get(_EPOCH_STATE) or {}
    epochs = summary.get("finished_epochs")
    return ResumePoint(path=path,
                       restarts=restarts if isinstance(restarts, int) and restarts >= 0 else 0,
                       finished_epochs=epochs if isinstance(epochs, int) else None,
                       finished=summary.get("finished") is True)


def restarts_for(given: int | None, point: ResumePoint | None) -> int:
    """The restart count of a run: ``given`` (``--restarts``) if not ``None``, else one
    more than the run that wrote the checkpoint ``point`` (0 without a checkpoint). Logs
    where it resumes from, at INFO, and warns when ``given`` is below the count."""
    if point is None:
        return 0 if given is None else given
    counted = point.restarts + 1
    state = f"the end of training ({point.finished_epochs} epochs)" if point.finished \
        else f"{point.finished_epochs} epochs finished" if point.finished_epochs is not None \
        else "a checkpoint"
    if point.finished:
        LOG.info("%s is %s: the script trains only if it asks for more epochs", point.path,
                 state)
    if given is None:
        LOG.info("resuming from %s (%s): restart %d", point.path, state, counted)
        return counted
    if given < counted:
        LOG.warning("--restarts %d is below the %d restarts the checkpoint %s counts; "
                    "using --restarts as given (leave it out to count from the checkpoint)",
                    given, counted, point.path)
    return given


def job_status(statuses: Sequence[int]) -> int:
    """One exit status for the job: the first failure (a status other than 0 and 143),
    else 0 if every replica finished, else 143 (the job stopped after a checkpoint)."""
    failures = [s for s in statuses if s not in (0, 143)]
    if failures:
        return failures[0]
    return 0 if all(s == 0 for s in statuses) else 143


def end_line(status: int, checkpoint_path: str | Path | None,
             point: ResumePoint | None) -> str:
    """The launcher's last line: how the job ended and where its newest checkpoint is
    (the replicas log each checkpoint at INFO, which a script without logging set up
    does not show).

    Args:
        status: the job's status (:func:`job_status`).
        checkpoint_path: ``--checkpoint-path`` (``None``: not given).
        point: the newest checkpoint there now (:func:`resume_point`), or ``None``.
    """
    how = "finished" if status == 0 else "stopped at a checkpoint" if status == 143 \
        else f"failed (status {status})"
    if checkpoint_path is None:
        return f"job {how}; no --checkpoint-path, nothing saved"
    if point is None:
        return f"job {how}; no checkpoint under {checkpoint_path}"
    state = f"the end of training ({point.finished_epochs} epochs)" if point.finished \
        else f"{point.finished_epochs} epochs finished" \
        if point.finished_epochs is not None else "a checkpoint"
    again = "; the same command resumes it" if status != 0 and not point.finished else ""
    return f"job {how}; newest checkpoint {point.path} ({state}){again}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``python -m adaptdl_core.launch`` command line; returns the job's status."""
    parser = argparse.ArgumentParser(
        prog="python -m adaptdl_core.launch",
        description="Run the replicas of one elastic training job on this machine.")
    parser.add_argument("--replicas", type=int, default=1, help="number of replicas")
    parser.add_argument("--checkpoint-path", default=None,
                        help="checkpoint directory (resume from it when it holds one)")
    parser.add_argument("--restarts", type=int, default=None,
                        help="restarts so far (default: one more than the newest "
                             "checkpoint's run, 0 without a checkpoint)")
    parser.add_argument("--master-port", type=int, default=None, help="default: a free port")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    opts = parser.parse_args(argv)
    if opts.replicas < 1:
        parser.error(f"--replicas {opts.replicas}: must be >= 1")
    if opts.restarts is not None and opts.restarts < 0:
        parser.error(f"--restarts {opts.restarts}: must be >= 0 (or leave it out to "
                     "count from the checkpoint)")
    if not logging.getLogger().handlers:
        # (The command line's own lines; the replicas configure their logging themselves.)
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        point = resume_point(opts.checkpoint_path)
    except checkpoint.CheckpointError as exc:
        parser.error(f"--checkpoint-path {opts.checkpoint_path}: {exc}")
    restarts = restarts_for(opts.restarts, point)
    procs = start_replicas([sys.executable, opts.script, *opts.args], opts.replicas,
                           checkpoint_path=opts.checkpoint_path, num_restarts=restarts,
                           master_port=opts.master_port)
    while True:
        try:
            statuses = [status for status, _ in wait_replicas(procs)]
            break
        except KeyboardInterrupt:
            # The replicas got the same Ctrl-C and are checkpointing: keep waiting for
            # them (a second Ctrl-C reaches them too and stops them at once).
            continue
    status = job_status(statuses)
    try:
        point = resume_point(opts.checkpoint_path)
    except checkpoint.CheckpointError:
        point = None
    LOG.info("%s", end_line(status, opts.checkpoint_path, point))
    return status


if __name__ == "__main__":
    sys.exit(main())
