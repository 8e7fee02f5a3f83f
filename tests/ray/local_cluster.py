"""A private one-node Ray cluster with a dashboard, for tests of the Job Submission path.

``ray.init(address="local", include_dashboard=True)`` cannot choose the dashboard agent's
port, and on a machine where another Ray instance holds the default one (52365) the agent
runs without its HTTP server, so every job submission fails ("No available agent to
submit job"). This helper runs ``ray start --head --block`` instead, with every port picked
free and a temporary directory of its own (so no other process on the machine finds this
cluster through the usual search, and this cluster joins no other), and stops it by
signalling that process, never with ``ray stop`` (which stops every Ray instance on the
machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

__all__ = ["LocalCluster", "cluster_env", "REPO_ROOT"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cluster_env(extra: dict | None = None) -> dict:
    """The environment of a cluster's processes and of drivers joining it: the repository
    importable (Ray workers import the tests' trial functions), token authentication off
    (drivers in other processes join without a token)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env["RAY_AUTH_MODE"] = "disabled"
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(extra or {})
    return env

_PORT_OPTIONS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port",
                 "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port",
                 "--ray-client-server-port")


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """``ray start --head`` on free ports; :attr:`address` is its dashboard URL.

    Args:
        num_cpus: logical CPUs of the node.
        env: the environment of the cluster's processes (default: this one's).
        timeout_s: how long to wait for the dashboard's job API.

    Raises:
        RuntimeError: the cluster did not come up (with the end of its output).
    """

    def __init__(self, num_cpus: int = 4, env: dict[str, str] | None = None,
                 timeout_s: float = 60.0) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ray-")
        ports = dict(zip(_PORT_OPTIONS, _free_ports(len(_PORT_OPTIONS))))
        self.address = f"http://127.0.0.1:{ports['--dashboard-port']}"
        self.gcs_address = f"127.0.0.1:{ports['--port']}"
        #: Where the node exports Ray's metrics (Prometheus text at ``/metrics``).
        self.metrics_port = ports["--metrics-export-port"]
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                   "--num-cpus", str(num_cpus), "--include-dashboard", "true",
                   "--dashboard-host", "127.0.0.1", "--node-ip-address", "127.0.0.1",
                   "--temp-dir", self.temp_dir, "--disable-usage-stats",
                   "--object-store-memory", str(150 * 2**20)]
        for option, port in ports.items():
            command += [option, str(port)]
        self._log = open(os.path.join(self.temp_dir, "ray-start.log"), "w+")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.address}/api/version", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not start within {timeout_s:.0f} s:\n"
                           f"{self.output()[-3000:]}")

    def output(self) -> str:
        """What ``ray start`` printed so far."""
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the cluster (SIGTERM to ``ray start --block``, which stops its processes;
        then SIGKILL to its process group if needed) and remove its files. (With the
        dashboard on, ``ray start --block`` was seen ignoring SIGTERM for over 30 s; the
        group's SIGKILL left no process of the cluster behind.)"""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
