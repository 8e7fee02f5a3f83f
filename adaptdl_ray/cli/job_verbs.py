"""The verbs that act on one job: ``submit``, ``logs``, ``stop``, ``cp``, ``tensorboard``."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from adaptdl_ray.cli.cluster import Cluster
from adaptdl_ray.cli.errors import PROG, CliError
from adaptdl_ray.cli.submissions import (NAME_KEY, OWNER_KEY, STORAGE_KEY, TERMINAL,
                                         files_of, latest, refuse_others, status_of,
                                         submissions)
from adaptdl_ray.cluster.elastic_job import job_spec
from adaptdl_ray.cluster.job_files import JobFiles
from adaptdl_ray.cluster.owner import current_owner

__all__ = ["cmd_submit", "cmd_logs", "cmd_stop", "cmd_cp", "cmd_tensorboard",
           "strip_colours"]

# Colour and cursor sequences (Ray colours its log prefixes).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_colours(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return _ANSI.sub("", text)


# -- submit -------------------------------------------------------------------------------
def _script_location(script: str, working_dir: str | None) -> tuple[str, str]:
    """``(working directory to upload, script path inside it)``.

    Without ``--working-dir`` the script's own directory travels with it; with one, a
    relative SCRIPT is taken inside it, an absolute one must lie inside it.

    Raises:
        CliError: the script is missing or outside the working directory.
    """
    if working_dir is None:
        path = Path(script).resolve()
        if not path.is_file():
            raise CliError(f"script {script!r} not found: pass the path of a training script")
        return str(path.parent), path.name
    base = Path(working_dir).resolve()
    if not base.is_dir():
        raise CliError(f"--working-dir {working_dir!r} is not a directory")
    path = Path(script) if Path(script).is_absolute() else base / script
    path = path.resolve()
    if not path.is_file():
        raise CliError(f"script {script!r} not found in --working-dir {working_dir}: give "
                       "its path inside that directory")
    try:
        return str(base), str(path.relative_to(base))
    except ValueError:
        raise CliError(f"script {script!r} is outside --working-dir {working_dir}: move it "
                       "there or pick a directory that holds it") from None


def _check_syntax(path: Path) -> None:
    """Refuse a script Python cannot parse here, before it fails on the cluster.

    Raises:
        CliError: a syntax error (file, line and Python's message)."""
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise CliError(f"{path}:{exc.lineno}: {exc.msg}: the script does not parse; fix it "
                       "before submitting") from None
    except (OSError, ValueError) as exc:  # unreadable, or a null byte
        raise CliError(f"cannot read script {path}: {exc}") from None


def _entrypoint(opts: argparse.Namespace, script: str) -> str:
    command = ["python", "-m", "adaptdl_ray.cluster.elastic_job", "--name", opts.name,
               "--min-replicas", str(opts.min_replicas),
               "--cpus-per-replica", f"{opts.cpus_per_replica:g}",
               "--gpus-per-replica", f"{opts.gpus_per_replica:g}",
               "--stop-timeout", f"{opts.stop_timeout:g}",
               "--checkpoint-interval", f"{opts.checkpoint_interval:g}",
               "--allocation-interval", f"{opts.allocation_interval:g}",
               "--owner", current_owner()]
    if opts.max_replicas is not None:
        command += ["--max-replicas", str(opts.max_replicas)]
    if opts.storage_path:
        command += ["--storage-path", opts.storage_path]
    return shlex.join(command + [script, *opts.args])


def _already_running(name: str, submission_id: str) -> CliError:
    return CliError(f"job {name} is already running (Ray job {submission_id}): stop it first "
                    f"with `{PROG} stop {name}`, or pick another --name")


def cmd_submit(opts: argparse.Namespace) -> int:
    """Submit a training script as an elastic job (or resume a stopped one)."""
    try:
        spec = job_spec(opts)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not opts.stop_timeout > 0:
        raise CliError(f"--stop-timeout {opts.stop_timeout:g}: must be > 0 seconds")
    working_dir, script = _script_location(opts.script, opts.working_dir)
    _check_syntax(Path(working_dir) / script)
    cluster = Cluster.from_options(opts)
    client = cluster.jobs()
    earlier = submissions(client, opts.name)
    running = [j for j in earlier if status_of(j) not in TERMINAL]
    if running:
        raise _already_running(opts.name, running[-1].submission_id)
    if earlier:
        refuse_others(earlier[-1], "submit", opts.force)
    submission_id = f"adaptdl-{opts.name}-{len(earlier) + 1}"
    runtime_env = {"working_dir": working_dir,
                   # Ray's job stop sends SIGTERM, then SIGKILL after this many seconds: the
                   # driver needs the replicas' stop at a batch boundary to fit.
                   "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(int(opts.stop_timeout) + 60)}}
    try:
        client.submit_job(entrypoint=_entrypoint(opts, script), submission_id=submission_id,
                          runtime_env=runtime_env,
                          metadata={NAME_KEY: opts.name, STORAGE_KEY: opts.storage_path or "",
                                    OWNER_KEY: current_owner()})
    except RuntimeError as exc:
        if "already exists" in str(exc):
            raise _already_running(opts.name, submission_id) from None
        raise CliError(f"Ray refused the job: {' '.join(str(exc).split())}") from None
    bounds = f"{spec.min_replicas}-{spec.max_replicas}" if spec.max_replicas else \
        f"{spec.min_replicas}+"
    resume = " (resumes from its checkpoint, if it has one)" if earlier else ""
    resources = ", ".join(f"{v:g} {k}" for k, v in spec.resources.items())
    print(f"submitted job {opts.name}{resume}: Ray job {submission_id}, {bounds} replicas of "
          f"{resources}; follow it with: {PROG} logs {opts.name} -f")
    return 0


# -- logs ---------------------------------------------------------------------------------
def cmd_logs(opts: argparse.Namespace) -> int:
    """Print a job's output (its latest submission's; ``--all``: every submission's),
    without colour codes unless the output is a terminal."""
    cluster = Cluster.from_options(opts)
    client = cluster.jobs()
    newest = latest(cluster, opts.name)
    shown = submissions(client, opts.name) if opts.all else [newest]
    follow = opts.follow and status_of(newest) not in TERMINAL
    plain = not sys.stdout.isatty()

    def write(text: str) -> None:
        sys.stdout.write(strip_colours(text) if plain else text)

    for details in shown:
        if opts.all:
            write(f"==> {details.submission_id} ({status_of(details).lower()}) <==\n")
        if follow and details is shown[-1]:
            sys.stdout.flush()
            return _follow(client, details.submission_id, write)
        write(client.get_job_logs(details.submission_id))
    sys.stdout.flush()
    return 0


def _follow(client: Any, submission_id: str, write: Any) -> int:
    """Print the job's output from its start and follow it until it ends (Ctrl-C stops
    following, not the job)."""
    async def tail() -> None:
        async for chunk in client.tail_job_logs(submission_id):
            write(chunk)
            sys.stdout.flush()
    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        return 130
    return 0


# -- stop ---------------------------------------------------------------------------------
def cmd_stop(opts: argparse.Namespace) -> int:
    """Checkpoint a running job at its next batch boundary and stop it."""
    cluster = Cluster.from_options(opts)
    client = cluster.jobs()
    newest = latest(cluster, opts.name)
    status = status_of(newest)
    if status in TERMINAL:
        raise CliError(f"job {opts.name} is not running (its last run {status.lower()}): "
                       f"nothing to stop; resume it with `{PROG} submit --name {opts.name} ...`")
    refuse_others(newest, "stop", opts.force)
    client.stop_job(newest.submission_id)
    deadline = time.monotonic() + opts.timeout
    while status_of(client.get_job_info(newest.submission_id)) not in TERMINAL:
        if time.monotonic() > deadline:
            raise CliError(f"job {opts.name} did not stop within {opts.timeout:g} s: see "
                           f"`{PROG} logs {opts.name}`; wait longer with --timeout")
        time.sleep(0.2)
    files = files_of(newest)
    record = files.read_status() or {}
    where = files.latest_checkpoint()
    if record.get("status") == "finished":
        print(f"job {opts.name} finished before it could stop; checkpoint: {where}")
    elif where is None:
        print(f"stopped job {opts.name} before its first checkpoint (it starts afresh when "
              "submitted again)")
    else:
        print(f"stopped job {opts.name} at epoch {record.get('epochs_done', '?')} "
              f"(restart {record.get('restarts', '?')}); checkpoint: {where}; resume it with "
              f"`{PROG} submit --name {opts.name} ...` (the same command)")
    return 0


# -- cp -----------------------------------------------------------------------------------
def _checked_destination(dest: str) -> Path:
    """``dest`` as an absolute path, if a checkpoint can be copied there.

    Raises:
        CliError: it is a file, or its parent folder does not exist."""
    path = Path(dest).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise CliError(f"{dest} is a file: pass a new directory, or an existing one to copy "
                       "into")
    if not path.exists() and not path.parent.is_dir():
        raise CliError(f"{dest}: its folder {path.parent} does not exist: create it first "
                       f"(mkdir -p {shlex.quote(str(path.parent))}) or pick another DEST")
    return path


def cmd_cp(opts: argparse.Namespace) -> int:
    """Copy a job's latest checkpoint out, and say how to load its weights."""
    dest = _checked_destination(opts.dest)
    if opts.storage_path is not None:
        files = JobFiles(opts.name, opts.storage_path)
        if not files.exists():
            raise CliError(f"no job named {opts.name!r} under --storage-path "
                           f"{opts.storage_path}")
    else:
        details = latest(Cluster.from_options(opts), opts.name)
        refuse_others(details, "cp", opts.force)
        files = files_of(details)
    point = files.resume_point()
    try:
        path = files.copy_latest(dest)
    except (FileNotFoundError, FileExistsError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot copy to {opts.dest}: {exc.strerror or exc}") from None
    where = ""
    if point is not None:
        state = "the end of training" if point.finished else "a checkpoint"
        epochs = f", {point.finished_epochs} epochs finished" \
            if point.finished_epochs is not None else ""
        where = f" ({state}{epochs}, restart {point.restarts})"
    print(f"copied job {opts.name}'s newest checkpoint{where} to {path}")
    print(f"its model weights: adaptdl_core.torch.model_state_dict({str(path)!r})")
    return 0


# -- tensorboard ----------------------------------------------------------------------------
def cmd_tensorboard(opts: argparse.Namespace) -> int:
    """Run TensorBoard on a job's event files."""
    if importlib.util.find_spec("tensorboard") is None:
        raise CliError("tensorboard is not installed here: pip install tensorboard")
    files = JobFiles(opts.name, opts.storage_path) if opts.storage_path else \
        files_of(latest(Cluster.from_options(opts), opts.name))
    logdir = files.root / "tensorboard"
    logdir.mkdir(parents=True, exist_ok=True)
    print(f"TensorBoard on {logdir} (scripts write there through $ADAPTDL_TENSORBOARD_LOGDIR)",
          flush=True)
    return subprocess.call([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                            "--port", str(opts.port)])
