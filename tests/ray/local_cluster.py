"""A Ray cluster of its own for a test or a benchmark: ``ray start --head --block`` in its
own process group, stopped by signalling that group (never ``ray stop``, which stops every
Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(extra: dict | None = None) -> dict:
    """The environment of the cluster's processes and of drivers joining it: the repository
    importable, token authentication off (drivers in other processes join without a token)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env["RAY_AUTH_MODE"] = "disabled"
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(extra or {})
    return env


@contextlib.contextmanager
def head_node(num_cpus: int, *, dashboard: bool = False, timeout_s: float = 90.0,
              extra_args: tuple = ()) -> Iterator[dict]:
    """Start a one-node cluster with ``num_cpus`` logical CPUs; yields ``{"address",
    "dashboard" (its URL or None), "temp_dir"}``; stops it on exit."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="adaptdl-ray-")
    args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            f"--port={port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
            f"--temp-dir={temp_dir}", "--disable-usage-stats",
            f"--include-dashboard={'true' if dashboard else 'false'}",
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            "--object-store-memory=150000000", *extra_args]
    dashboard_port = None
    if dashboard:
        dashboard_port = free_port()
        args += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    log = open(os.path.join(temp_dir, "head.log"), "w")
    proc = subprocess.Popen(args, env=cluster_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}; see "
                                   f"{log.name}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the head node did not listen on {address} within "
                                   f"{timeout_s:.0f} s; see {log.name}")
            time.sleep(0.2)
        yield {"address": address, "temp_dir": temp_dir,
               "dashboard": f"http://127.0.0.1:{dashboard_port}" if dashboard else None}
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc`` (``start_new_session``); SIGKILL what is left
    of it after ``timeout_s`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)  # children (raylet, GCS) may outlive the leader
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
