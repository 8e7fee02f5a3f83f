"""``adaptdl-ray``: submit, list, follow, stop and collect elastic jobs on a Ray cluster.

::

    adaptdl-ray submit --name digits --max-replicas 4 train.py --epochs 10
    adaptdl-ray ls
    adaptdl-ray logs digits -f
    adaptdl-ray stop digits          # checkpoint at the next batch, then stop
    adaptdl-ray submit --name digits --max-replicas 4 train.py --epochs 10   # resumes
    adaptdl-ray cp digits ./digits-checkpoint

(also ``python -m adaptdl_ray``). Jobs run through Ray's Job Submission API: each
``submit`` is one Ray job (submission id ``adaptdl-<name>-<k>``, the name in its
metadata) whose entrypoint is :mod:`adaptdl_ray.cluster.elastic_job`. Without
``--address`` the cluster is found as ``ray job submit`` finds it: ``RAY_ADDRESS``, else
the local dashboard at ``127.0.0.1:8265``, else a Ray instance running on this machine.
A job's checkpoint and records live under its storage path (see
:mod:`adaptdl_ray.cluster.job_files`), which ``cp``, ``ls`` and ``tensorboard`` read
from this machine: a local cluster, or storage shared with the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import urlparse

from adaptdl_ray.cluster.elastic_job import DEFAULT_STOP_TIMEOUT_S, add_job_arguments, job_spec
from adaptdl_ray.cluster.job_files import JobFiles

LOG = logging.getLogger(__name__)

__all__ = ["CliError", "build_parser", "main"]

_PROG = "adaptdl-ray"
_DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
_ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_NAME_KEY = "adaptdl_name"
_STORAGE_KEY = "adaptdl_storage_path"
_ALLOCATOR_MODULE = "adaptdl_ray.cluster.client"
_TERMINAL = {"STOPPED", "SUCCEEDED", "FAILED"}
# Ray's job status -> the word ls shows (a running job's own record says more).
_STATUS_WORDS = {"PENDING": "pending", "RUNNING": "running", "STOPPED": "stopped",
                 "SUCCEEDED": "finished", "FAILED": "failed"}
_COLUMNS = (("NAME", "name"), ("STATUS", "status"), ("REPLICAS", "replicas"),
            ("NODES", "nodes"), ("BATCH", "batch_size"), ("GOODPUT", "goodput"),
            ("RESTARTS", "restarts"), ("AGE", "age_s"), ("EXPERIMENT", "experiment"))


class CliError(Exception):
    """A failure the user can fix: printed as one line (``adaptdl-ray: error: ...``), exit
    status 1."""


# -- the cluster ---------------------------------------------------------------------------
@contextlib.contextmanager
def _without_address_vars() -> Iterator[None]:
    """Hide RAY_ADDRESS (which Ray's client prefers to its argument) while an explicit
    ``--address`` is used."""
    saved = {k: os.environ.pop(k) for k in _ADDRESS_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _reachable(address: str) -> bool:
    """Whether something listens at ``address`` (a URL or ``host:port``), within 2 s."""
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or parsed.port is None:
        return True  # let Ray judge an address without a port
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=2.0):
            return True
    except OSError:
        return False


def _no_cluster(address: str | None) -> CliError:
    where = f"at {address}" if address else \
        f"(RAY_ADDRESS is not set, nothing at {_DEFAULT_DASHBOARD}, no local Ray instance)"
    return CliError(f"no Ray cluster {where}: start one with `ray start --head`, or pass "
                    "--address http://HEAD:8265 (or set RAY_ADDRESS)")


def _client_at(address: str | None) -> Any:
    """A JobSubmissionClient at ``address`` (``None``: Ray's own search).

    Raises:
        CliError: nothing answers there, or the cluster refused the connection.
    """
    import ray
    from ray.job_submission import JobSubmissionClient
    if address is not None and address != "auto" and not _reachable(address):
        raise _no_cluster(address)
    try:
        return JobSubmissionClient(address)
    except ConnectionError:
        raise _no_cluster(address) from None
    except ray.exceptions.AuthenticationError:
        raise CliError(f"the Ray cluster at {address or 'this machine'} wants a token: set "
                       "RAY_AUTH_TOKEN (or ~/.ray/auth_token) to the cluster's") from None
    except (RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        text = str(exc).strip().splitlines()
        raise CliError(f"cannot reach the Ray cluster at {address or 'this machine'}: "
                       f"{text[0] if text else type(exc).__name__}") from None


def _cluster_address(opts: argparse.Namespace) -> str | None:
    """The address the user gave: ``--address``, else RAY_API_SERVER_ADDRESS /
    RAY_ADDRESS, else ``None``."""
    if opts.address:
        return opts.address
    for var in _ADDRESS_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return None


def _client(opts: argparse.Namespace) -> Any:
    """The Job Submission client of the cluster ``opts`` point at (see the module
    docstring for the search without ``--address``)."""
    address = _cluster_address(opts)
    with _without_address_vars():
        if address is not None:
            return _client_at(address)
        if _reachable(_DEFAULT_DASHBOARD):
            return _client_at(_DEFAULT_DASHBOARD)
        try:
            return _client_at(None)
        except CliError as exc:
            if "no Ray cluster" in str(exc):
                raise _no_cluster(None) from None
            raise


def _submissions(client: Any, name: str | None = None) -> list[Any]:
    """The AdaptDL submissions on the cluster (of job ``name``), oldest first."""
    jobs = [j for j in client.list_jobs()
            if (j.metadata or {}).get(_NAME_KEY) and j.submission_id
            and (name is None or j.metadata[_NAME_KEY] == name)]
    return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id))


def _status_of(details: Any) -> str:
    return str(getattr(details.status, "value", details.status))


def _latest(client: Any, name: str, opts: argparse.Namespace) -> Any:
    """The newest submission of job ``name``.

    Raises:
        CliError: the cluster has no job of that name.
    """
    found = _submissions(client, name)
    if not found:
        raise CliError(f"no job named {name!r} on the cluster at "
                       f"{_cluster_address(opts) or 'this machine'}: see `{_PROG} ls`")
    return found[-1]


def _files_of(details: Any) -> JobFiles:
    """The job files of a submission (its storage path as submitted, read here)."""
    meta = details.metadata or {}
    return JobFiles(meta[_NAME_KEY], meta.get(_STORAGE_KEY) or None)


# -- verbs -----------------------------------------------------------------------------------
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


def _entrypoint(opts: argparse.Namespace, script: str) -> str:
    command = ["python", "-m", "adaptdl_ray.cluster.elastic_job", "--name", opts.name,
               "--min-replicas", str(opts.min_replicas),
               "--cpus-per-replica", f"{opts.cpus_per_replica:g}",
               "--gpus-per-replica", f"{opts.gpus_per_replica:g}",
               "--stop-timeout", f"{opts.stop_timeout:g}",
               "--checkpoint-interval", f"{opts.checkpoint_interval:g}"]
    if opts.max_replicas is not None:
        command += ["--max-replicas", str(opts.max_replicas)]
    if opts.storage_path:
        command += ["--storage-path", opts.storage_path]
    return shlex.join(command + [script, *opts.args])


def cmd_submit(opts: argparse.Namespace) -> int:
    """Submit a training script as an elastic job (or resume a stopped one)."""
    try:
        spec = job_spec(opts)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not opts.stop_timeout > 0:
        raise CliError(f"--stop-timeout {opts.stop_timeout:g}: must be > 0 seconds")
    working_dir, script = _script_location(opts.script, opts.working_dir)
    client = _client(opts)
    earlier = _submissions(client, opts.name)
    running = [j for j in earlier if _status_of(j) not in _TERMINAL]
    if running:
        raise _already_running(opts.name, running[-1].submission_id)
    submission_id = f"adaptdl-{opts.name}-{len(earlier) + 1}"
    runtime_env = {"working_dir": working_dir,
                   # Ray's job stop sends SIGTERM, then SIGKILL after this many seconds: the
                   # driver needs the replicas' stop at a batch boundary to fit.
                   "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(int(opts.stop_timeout) + 60)}}
    try:
        client.submit_job(entrypoint=_entrypoint(opts, script), submission_id=submission_id,
                          runtime_env=runtime_env,
                          metadata={_NAME_KEY: opts.name, _STORAGE_KEY: opts.storage_path or ""})
    except RuntimeError as exc:
        if "already exists" in str(exc):
            raise _already_running(opts.name, submission_id) from None
        raise CliError(f"Ray refused the job: {str(exc).strip().splitlines()[-1]}") from None
    bounds = f"{spec.min_replicas}-{spec.max_replicas}" if spec.max_replicas else \
        f"{spec.min_replicas}+"
    resume = " (resumes from its checkpoint, if it has one)" if earlier else ""
    print(f"submitted job {opts.name}{resume}: Ray job {submission_id}, {bounds} replicas of "
          f"{_resources(spec.resources)}; follow it with: {_PROG} logs {opts.name} -f")
    return 0


def _already_running(name: str, submission_id: str) -> CliError:
    return CliError(f"job {name} is already running (Ray job {submission_id}): stop it first "
                    f"with `{_PROG} stop {name}`, or pick another --name")


def _resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items())


def _allocator_client() -> Any:
    """The cluster allocator's client module (imported when first needed: it imports
    Ray)."""
    return importlib.import_module(_ALLOCATOR_MODULE)


def _driver_address(opts: argparse.Namespace) -> str:
    """The address a Ray driver joins the cluster by: a dashboard URL of this machine
    means the local instance, another host's means its Ray Client port."""
    address = _cluster_address(opts)
    if address is None or address == "auto":
        return "auto"
    if "://" not in address:
        return address
    parsed = urlparse(address)
    if parsed.scheme == "ray":
        return address
    if parsed.hostname in ("127.0.0.1", "localhost", socket.gethostname()):
        return "auto"
    return f"ray://{parsed.hostname}:10001"


def _allocator_jobs(opts: argparse.Namespace) -> list[dict[str, Any]]:
    """Every job and trial the cluster allocator knows ([] without one)."""
    client = _allocator_client()
    import ray
    try:
        if not ray.is_initialized():
            ray.init(address=_driver_address(opts), log_to_driver=False,
                     logging_level=logging.WARNING)
        handle = client.get_allocator(create=False)
        return [] if handle is None else list(ray.get(handle.jobs.remote(), timeout=30))
    except Exception as exc:  # noqa: BLE001 - ls still shows the submitted jobs
        LOG.warning("could not ask the cluster allocator (%s); showing submitted jobs only",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return []


def _row(details: Any, now: float) -> dict[str, Any]:
    """One submitted job as ls shows it: Ray's status, refined by the job's record."""
    files = _files_of(details)
    record = files.read_status() or {}
    ray_status = _status_of(details)
    status = _STATUS_WORDS.get(ray_status, ray_status.lower())
    # The job's own record says more (resizing, stopped after a checkpoint...) when it
    # was written by this submission's driver and agrees with Ray on whether it runs.
    current = (record.get("updated") or 0) * 1000 >= (details.start_time or 0)
    if current and (ray_status == "RUNNING" or record.get("status") in (
            "finished", "stopped") and ray_status in ("SUCCEEDED", "STOPPED")):
        status = record.get("status") or status
    elif ray_status == "RUNNING":
        status = "pending"  # its driver runs but has not started the replicas yet
    submitted = record.get("submitted") or (details.start_time or 0) / 1000.0
    live = status in ("pending", "running", "resizing", "stopping")
    return {"name": files.name, "status": status,
            "replicas": record.get("replicas", 0) if live else 0,
            "target": record.get("target", 0) if live else 0,
            "nodes": record.get("nodes"), "batch_size": record.get("batch_size"),
            "goodput": record.get("goodput"), "restarts": record.get("restarts", 0),
            "age_s": max(now - submitted, 0.0) if submitted else None,
            "experiment": record.get("experiment"), "epochs_done": record.get("epochs_done"),
            "epochs": record.get("epochs"), "submission_id": details.submission_id,
            "storage_path": str(files.root)}


def _format(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "age_s":
        seconds = int(value)
        return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
            f"{seconds // 60}m{seconds % 60:02d}s"
    if key == "goodput":
        return f"{value:.1f}"
    return str(value)


def cmd_ls(opts: argparse.Namespace) -> int:
    """List every AdaptDL job on the cluster."""
    client = _client(opts)
    now = time.time()
    latest: dict[str, Any] = {}
    for details in _submissions(client):
        latest[details.metadata[_NAME_KEY]] = details
    rows = {name: _row(details, now) for name, details in latest.items()}
    for job in _allocator_jobs(opts):
        name = job.get("name")
        if name:
            # A submitted job's own row (Ray's status, its record) is the newer; the
            # allocator adds what the row lacks (its target share, for one). Trials of
            # sweeps are known to the allocator only.
            own = rows.get(name, {})
            rows[name] = {**job, **{k: v for k, v in own.items() if v is not None}}
    ordered = sorted(rows.values(), key=lambda r: r["name"])
    if opts.json:
        print(json.dumps(ordered, indent=1))
        return 0
    table = [[header for header, _ in _COLUMNS]]
    table += [[_format(key, row.get(key)) for _, key in _COLUMNS] for row in ordered]
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def cmd_logs(opts: argparse.Namespace) -> int:
    """Print a job's output (its latest submission's; ``--all``: every submission's)."""
    client = _client(opts)
    latest = _latest(client, opts.name, opts)
    shown = _submissions(client, opts.name) if opts.all else [latest]
    follow = opts.follow and _status_of(latest) not in _TERMINAL
    for details in shown:
        if opts.all:
            print(f"==> {details.submission_id} ({_status_of(details).lower()}) <==")
        if follow and details is shown[-1]:
            sys.stdout.flush()
            return _follow(client, details.submission_id)
        sys.stdout.write(client.get_job_logs(details.submission_id))
    sys.stdout.flush()
    return 0


def _follow(client: Any, submission_id: str) -> int:
    """Print the job's output from its start and follow it until it ends (Ctrl-C stops
    following, not the job)."""
    async def tail() -> None:
        async for chunk in client.tail_job_logs(submission_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_stop(opts: argparse.Namespace) -> int:
    """Checkpoint a running job at its next batch boundary and stop it."""
    client = _client(opts)
    latest = _latest(client, opts.name, opts)
    status = _status_of(latest)
    if status in _TERMINAL:
        raise CliError(f"job {opts.name} is not running (its last run {status.lower()}): "
                       f"nothing to stop; resume it with `{_PROG} submit --name {opts.name} ...`")
    client.stop_job(latest.submission_id)
    deadline = time.monotonic() + opts.timeout
    while _status_of(client.get_job_info(latest.submission_id)) not in _TERMINAL:
        if time.monotonic() > deadline:
            raise CliError(f"job {opts.name} did not stop within {opts.timeout:g} s: see "
                           f"`{_PROG} logs {opts.name}`; wait longer with --timeout")
        time.sleep(0.2)
    record = _files_of(latest).read_status() or {}
    where = _files_of(latest).latest_checkpoint()
    if record.get("status") == "finished":
        print(f"job {opts.name} finished before it could stop; checkpoint: {where}")
    elif where is None:
        print(f"stopped job {opts.name} before its first checkpoint (it starts afresh when "
              "submitted again)")
    else:
        print(f"stopped job {opts.name} at epoch {record.get('epochs_done', '?')} "
              f"(restart {record.get('restarts', '?')}); checkpoint: {where}; resume it with "
              f"`{_PROG} submit --name {opts.name} ...` (the same command)")
    return 0


def cmd_cp(opts: argparse.Namespace) -> int:
    """Copy a job's latest checkpoint out."""
    if opts.storage_path is not None:
        files = JobFiles(opts.name, opts.storage_path)
        if not files.exists():
            raise CliError(f"no job named {opts.name!r} under --storage-path "
                           f"{opts.storage_path}")
    else:
        files = _files_of(_latest(_client(opts), opts.name, opts))
    try:
        path = files.copy_latest(opts.dest)
    except (FileNotFoundError, FileExistsError) as exc:
        raise CliError(str(exc)) from None
    print(path)
    return 0


def cmd_tensorboard(opts: argparse.Namespace) -> int:
    """Run TensorBoard on a job's event files."""
    if importlib.util.find_spec("tensorboard") is None:
        raise CliError("tensorboard is not installed here: pip install tensorboard")
    files = JobFiles(opts.name, opts.storage_path) if opts.storage_path else \
        _files_of(_latest(_client(opts), opts.name, opts))
    logdir = files.root / "tensorboard"
    logdir.mkdir(parents=True, exist_ok=True)
    print(f"TensorBoard on {logdir} (scripts write there through $ADAPTDL_TENSORBOARD_LOGDIR)",
          flush=True)
    return subprocess.call([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                            "--port", str(opts.port)])


def _connect(opts: argparse.Namespace) -> None:
    """Join the cluster as a Ray driver (``start``, ``status``).

    Raises:
        CliError: no cluster there, or the instance found on this machine is not the one
            whose dashboard ``--address`` names (several Ray instances on one machine)."""
    import ray
    address = _driver_address(opts)
    fix = "pass --address HOST:PORT, the address `ray start --head` printed"
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, ray.exceptions.RayError) as exc:
        raise CliError(f"cannot join the Ray cluster at {address}: "
                       f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; "
                       f"{fix}") from None
    dashboard = _cluster_address(opts)
    if address == "auto" and dashboard and "://" in dashboard:
        wanted = _session_of(dashboard)
        joined = ray.get_runtime_context().get_session_name()
        if wanted is not None and wanted != joined:
            ray.shutdown()
            raise CliError(f"the Ray instance found on this machine ({joined}) is not the "
                           f"cluster at {dashboard} ({wanted}); {fix}")


def _session_of(dashboard: str) -> str | None:
    """The Ray session name the dashboard at ``dashboard`` serves (``None``: unknown)."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"{dashboard.rstrip('/')}/api/version", timeout=5) as r:
            return json.loads(r.read().decode()).get("session_name")
    except (OSError, ValueError):
        return None


def autoscale_options(opts: argparse.Namespace) -> dict[str, Any] | None | bool:
    """``start``'s autoscaling options as the allocator takes them: a dict for
    ``--autoscale``, ``{}`` for ``--no-autoscale``, ``None`` when neither is given
    (leave the allocator's as they are).

    Raises:
        CliError: a missing or malformed option, naming it and the fix."""
    scale_args = ("min_nodes", "max_nodes", "node_template", "baseline_nodes")
    given = [a for a in scale_args if getattr(opts, a) is not None]
    if opts.no_autoscale:
        if opts.autoscale or given:
            raise CliError("--no-autoscale takes no other autoscaling option")
        return {}
    if not opts.autoscale:
        if given:
            raise CliError(f"--{given[0].replace('_', '-')} needs --autoscale")
        return None
    missing = [f"--{a.replace('_', '-')}" for a in scale_args[:3] if getattr(opts, a) is None]
    if missing:
        raise CliError(f"--autoscale needs {' '.join(missing)} (e.g. --min-nodes 1 "
                       "--max-nodes 8 --node-template '{\"CPU\": 8, \"GPU\": 1}')")
    try:
        template = json.loads(opts.node_template)
    except ValueError:
        raise CliError(f"--node-template must be JSON, e.g. '{{\"CPU\": 8}}', got "
                       f"{opts.node_template!r}") from None
    options = {"node_template": template, "min_nodes": opts.min_nodes,
               "max_nodes": opts.max_nodes}
    if opts.baseline_nodes is not None:
        options["baseline_nodes"] = opts.baseline_nodes
    try:
        _allocator_client().check_autoscale(options)
    except ValueError as exc:
        raise CliError(f"--autoscale: {exc}") from None
    return options


def cmd_start(opts: argparse.Namespace) -> int:
    """Start the cluster allocator (if it is not running); with ``--autoscale`` or
    ``--no-autoscale``, turn its autoscaling on or off."""
    autoscale = autoscale_options(opts)
    client = _allocator_client()
    _connect(opts)
    client.start_allocator(opts.namespace, autoscale=autoscale)
    ns = client.namespace(opts.namespace)
    print(f"the cluster allocator runs (namespace {ns})")
    if autoscale:
        print(f"autoscaling: {autoscale['min_nodes']} to {autoscale['max_nodes']} nodes of "
              f"{json.dumps(autoscale['node_template'])}")
    elif autoscale is not None:
        print("autoscaling: off (its request to Ray's autoscaler is withdrawn)")
    return 0


def cmd_status(opts: argparse.Namespace) -> int:
    """Print the cluster allocator's state."""
    import ray
    client = _allocator_client()
    _connect(opts)
    handle = client.get_allocator(opts.namespace, create=False)
    if handle is None:
        raise CliError(f"no cluster allocator runs (namespace "
                       f"{client.namespace(opts.namespace)}): start it with `{_PROG} start`")
    print(json.dumps(ray.get(handle.status.remote(), timeout=30), indent=1, default=str))
    return 0


# -- parsing ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``adaptdl-ray`` argument parser (one sub-command per verb)."""
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Elastic AdaptDL jobs on a Ray cluster (Ray Job Submission).")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    cluster = argparse.ArgumentParser(add_help=False)
    cluster.add_argument("--address", default=None, metavar="ADDR",
                         help="the cluster's dashboard, e.g. http://HEAD:8265, or, for "
                              "start and status, its GCS address HEAD:6379 (default: "
                              "RAY_ADDRESS, else the local cluster)")

    def verb(name: str, fn: Any, text: str, parents=(cluster,)) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, parents=list(parents), help=text, description=text)
        sub.set_defaults(fn=fn)
        return sub

    submit = verb("submit", cmd_submit, "run a training script as an elastic job (the same "
                  "--name again resumes a stopped job)")
    add_job_arguments(submit)
    submit.add_argument("--working-dir", default=None, metavar="DIR",
                        help="directory uploaded with the job (default: the script's own)")
    submit.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                        metavar="S", help="seconds a stop or resize waits for a batch "
                                          f"boundary (default {DEFAULT_STOP_TIMEOUT_S:g})")
    submit.add_argument("script", metavar="SCRIPT", help="the training script")
    submit.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's own arguments")

    ls = verb("ls", cmd_ls, "list the AdaptDL jobs on the cluster")
    ls.add_argument("--json", action="store_true", help="print a JSON list of objects")

    logs = verb("logs", cmd_logs, "print a job's output")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--all", action="store_true", help="every submission's, oldest first")

    stop = verb("stop", cmd_stop, "checkpoint a job at its next batch boundary and stop it")
    stop.add_argument("name", metavar="NAME")
    stop.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S + 60,
                      metavar="S", help="seconds to wait for the stop")

    cp = verb("cp", cmd_cp, "copy a job's latest checkpoint to DEST")
    cp.add_argument("name", metavar="NAME")
    cp.add_argument("dest", metavar="DEST", help="a new directory, or an existing one to "
                                                 "copy into")
    cp.add_argument("--storage-path", default=None, metavar="P",
                    help="read the job from this storage path (no cluster needed)")

    tb = verb("tensorboard", cmd_tensorboard, "run TensorBoard on a job's event files")
    tb.add_argument("name", metavar="NAME")
    tb.add_argument("--port", type=int, default=6006)
    tb.add_argument("--storage-path", default=None, metavar="P",
                    help="read the job from this storage path (no cluster needed)")

    subs = {}
    for name, fn, text in (("start", cmd_start, "start the cluster allocator (and turn its "
                                                "autoscaling on or off)"),
                           ("status", cmd_status, "print the cluster allocator's state")):
        subs[name] = verb(name, fn, text)
        subs[name].add_argument("--namespace", default=None,
                                help="the allocator's Ray namespace (default: "
                                     "$ADAPTDL_RAY_NAMESPACE, else adaptdl)")
    start = subs["start"]
    start.add_argument("--autoscale", action="store_true",
                       help="ask Ray's autoscaler for the nodes Pollux's goodput rule wants")
    start.add_argument("--no-autoscale", action="store_true",
                       help="stop autoscaling and withdraw the standing request")
    start.add_argument("--min-nodes", type=int, default=None, metavar="N",
                       help="fewest nodes of the template the cluster keeps")
    start.add_argument("--max-nodes", type=int, default=None, metavar="N",
                       help="most nodes of the template")
    start.add_argument("--node-template", default=None, metavar="JSON",
                       help="the resources of one node to add, e.g. '{\"CPU\": 8, \"GPU\": 1}'")
    start.add_argument("--baseline-nodes", type=int, default=None, metavar="N",
                       help="template nodes the cluster keeps without asking (Ray's "
                            "min_workers, plus the head if it has the template's shape); "
                            "wanting no more withdraws the request (default 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``adaptdl-ray``; returns the exit status (0 done, 1 error, 2 bad usage)."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{_PROG}: %(message)s")
    try:
        return opts.fn(opts)
    except CliError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
