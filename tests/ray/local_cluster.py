"""A private one-node Ray cluster with a dashboard, for tests of the Job Submission path.

``ray.init(address="local", include_dashboard=True)`` cannot choose the dashboard agent's
port, and on a machine where another Ray instance holds the default one (52365) the agent
runs without its HTTP server, so every job submission fails ("No available agent to
submit job"). This helper runs ``ray start --head --block`` instead, with a temporary
directory of its own (so no other process on the machine finds this cluster through the
usual search, and this cluster joins no other), and stops it by signalling that process,
never with ``ray stop`` (which stops every Ray instance on the machine).

Ports: Ray picks (and binds at once) every port it can pick itself and nobody here needs
to know (``0``). The few this helper must name in advance (the GCS, the dashboard, the
metrics export and the Ray client server: Ray cannot report them all, nor take a bound
socket) are picked free below the ports the kernel hands out itself (:func:`free_ports`),
which leaves a moment in which another process naming ports may take one: the cluster is
then known by its dashboard answering with this cluster's session (not another cluster's
or another server's that took the port), and a start that fails is retried on newly picked
ports.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

__all__ = ["LocalCluster", "cluster_env", "free_ports", "REPO_ROOT"]

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

# Ports Ray picks itself (0) and nobody here needs to know.
_RAY_PICKS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port")
# Ports this helper must know (or Ray cannot pick: the client server's).
_PICKED_HERE = ("--port", "--dashboard-port", "--metrics-export-port",
                "--ray-client-server-port")
_ATTEMPTS = 3
# The ports Ray's workers take by default (``--min-worker-port``, ``--max-worker-port``).
_RAY_WORKER_PORTS = (10002, 19999)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for sockets bound to port 0 (Linux's
    ``ip_local_port_range``; its default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct ports free a moment ago, outside the kernel's ephemeral range.

    Every process that binds port 0 (Ray's workers and agents, of any Ray instance on the
    machine) gets a port of that range, and gRPC servers bind with ``SO_REUSEPORT``: one
    that took a port picked here before ``ray start`` bound it would then share it with
    this cluster's server, and calls would reach the wrong one (the likely cause of a GCS
    that never answered a driver, and of a dashboard port that answered in HTTP/2, both
    seen under a loaded suite). Ports below the range are handed to nobody who does not
    ask for them by number. Each candidate is bound on every interface and held until all
    are picked, then released for ``ray start``. They are above Ray's worker ports too
    (:data:`_RAY_WORKER_PORTS`), which ``ray start`` refuses to see named. (Where the
    ephemeral range starts too low to leave room, the kernel picks, as before.)"""
    rng = rng or random.Random()
    low = min(ephemeral_range()[0], 65536)
    first = _RAY_WORKER_PORTS[1] + 1
    socks: list[socket.socket] = []
    try:
        for _ in range(20 * count):
            if len(socks) == count:
                break
            s = socket.socket()
            try:
                s.bind(("", rng.randrange(first, low) if low - first >= 1000 else 0))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < count:
            raise RuntimeError(f"found {len(socks)} free ports of {count} in "
                               f"[{first}, {low})")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """``ray start --head`` on free ports; :attr:`address` is its dashboard URL.

    Args:
        num_cpus: logical CPUs of the node.
        env: the environment of the cluster's processes (default: this one's).
        timeout_s: how long to wait for the dashboard's job API, per attempt.

    Raises:
        RuntimeError: the cluster did not come up in :data:`_ATTEMPTS` attempts (with the
            end of the last attempt's output).
    """

    def __init__(self, num_cpus: int = 4, env: dict[str, str] | None = None,
                 timeout_s: float = 60.0) -> None:
        for attempt in range(1, _ATTEMPTS + 1):
            self._start(num_cpus, env)
            try:
                self._wait_ready(timeout_s)
                return
            except BaseException as exc:
                output = self.output()
                self.stop()
                if attempt == _ATTEMPTS or not isinstance(exc, RuntimeError):
                    raise
                print(f"LocalCluster: attempt {attempt} failed ({exc}); retrying on other "
                      f"ports. Its output ends with:\n{output[-1500:]}", file=sys.stderr)

    def _start(self, num_cpus: int, env: dict[str, str] | None) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ray-")
        ports = dict(zip(_PICKED_HERE, free_ports(len(_PICKED_HERE))))
        ports.update(dict.fromkeys(_RAY_PICKS, 0))
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

    def _wait_ready(self, timeout_s: float) -> None:
        """Wait until the dashboard at :attr:`address` answers as this cluster's (its
        session directory is under :attr:`temp_dir`: another cluster may have taken the
        port first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with status {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as r:
                    session = json.loads(r.read().decode()).get("session_name", "")
            except (OSError, ValueError):  # (not up yet: refused, reset, half an answer)
                time.sleep(0.5)
                continue
            except http.client.HTTPException as exc:  # not HTTP: another server took it
                raise RuntimeError(f"port {self.address} answers for another server "
                                   f"({type(exc).__name__})") from exc
            if session and os.path.isdir(os.path.join(self.temp_dir, session)):
                return
            raise RuntimeError(f"port {self.address} answers for another cluster "
                               f"(session {session!r})")
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
