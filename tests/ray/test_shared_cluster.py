"""Two sweeps in two driver processes share one Ray cluster through the cluster allocator:
the replicas given never exceed the cluster, every trial trains every sample
of every epoch exactly once, trials grow when others end, and each job's state is a Ray
metric on the node's metrics port."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.ray.interrupt_scenario import records
from tests.ray.local_cluster import REPO_ROOT, LocalCluster, cluster_env
from tests.ray.shared_run import exactly_once, peak_replicas

# The test starts a cluster and two sweeps (a minute).
pytestmark = pytest.mark.slow

DRIVER = os.path.join(REPO_ROOT, "tests", "ray", "shared_run.py")
# Each sweep: one long trial and one short; the long ones grow once the short ones end.
# (Pollux moves no job younger than about its resize cost, nor one with less than two
# resize costs left: with the default 30 s assumed before a resize is measured, the long
# trials would have to run for minutes.)
SHAPE = {"cpus": 4, "trials": 2, "epochs": 2, "long_epochs": 12, "size": 192,
         "batch_size": 16, "sleep_per_sample": 0.01, "sleep_per_step": 0.05, "interval": 2.0,
         "resize_prior": 5.0}


def _allocator_view(address: str) -> dict:
    code = ("import json, ray; from adaptdl_ray.cluster import client; "
            f"ray.init(address={address!r}, log_to_driver=False); "
            "h = client.get_allocator(); "
            "print(json.dumps({'history': ray.get(h.history.remote()), "
            "'status': ray.get(h.status.remote())}))")
    out = subprocess.run([sys.executable, "-c", code], env=cluster_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def grown(records_dirs) -> bool:
    """Whether a trial recorded under any of ``records_dirs`` (a directory per trial)
    started with 2 replicas or more (they all start with one: it grew)."""
    return any(e["event"] == "start" and e["replicas"] >= 2
               for d in records_dirs for trial in d.iterdir() if trial.is_dir()
               for e in records(trial))


def test_two_sweeps_share_one_cluster(tmp_path):
    # The trials train slowly until one of them has grown (the file below), then as fast
    # as they go: the grow is the event the long trials are there for.
    grew = tmp_path / "grew"
    shape = [a for k, v in SHAPE.items() for a in (f"--{k.replace('_', '-')}", str(v))] + \
        ["--always-resize", "--slow-until", str(grew)]
    with LocalCluster(num_cpus=SHAPE["cpus"], env=cluster_env()) as cluster:
        procs = []
        for name in ("sweep-a", "sweep-b"):
            records = tmp_path / f"{name}-records"
            records.mkdir()
            out = tmp_path / f"{name}.json"
            log = open(tmp_path / f"{name}.log", "w")
            procs.append((name, out, records, log, subprocess.Popen(
                [sys.executable, DRIVER, "--arm", "shared", "--address", cluster.gcs_address,
                 "--name", name, "--out", str(out), "--record-dir", str(records),
                 "--storage", str(tmp_path / "storage"), *shape],
                env=cluster_env(), stdout=log, stderr=subprocess.STDOUT)))
        deadline = time.monotonic() + 360
        while any(p.poll() is None for *_, p in procs) and time.monotonic() < deadline:
            if not grew.exists() and grown([records for _, _, records, _, _ in procs]):
                grew.touch()
            time.sleep(0.2)
        for name, out, records, log, proc in procs:
            assert proc.wait(timeout=10) == 0, open(log.name).read()[-3000:]
        view = _allocator_view(cluster.gcs_address)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics",
                                         timeout=30).read().decode()
    trials = []
    for name, out, records, log, _ in procs:
        record = json.load(open(out))
        assert all(t["error"] is None for t in record["trials"]), record
        assert exactly_once(str(records), argparse.Namespace(**SHAPE)) is True
        trials += record["trials"]
    # The allocator never gave more replicas than the cluster holds, and both
    # experiments' trials were in its solves.
    assert 0 < peak_replicas(view["history"]) <= SHAPE["cpus"]
    assert len(view["history"]) == 2 * SHAPE["trials"]
    assert view["status"]["members"] == 0  # both experiments left when they ended
    # Trials grew as the others ended (4 trials on 4 CPUs start at one replica each).
    assert max(t["replicas"] for t in trials) >= 2
    assert any(t["restarts"] for t in trials)
    assert "adaptdl_job_replicas" in metrics and 'experiment="sweep-a"' in metrics
