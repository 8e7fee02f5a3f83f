"""``adaptdl-ray`` end to end, on a private local cluster this module starts and stops.

One test follows a 2-replica job through submit, ``ls``, ``stop`` (mid-run), ``submit``
of the same name (it resumes), ``logs`` and ``cp``, and checks that every sample of every
epoch was trained exactly once across the stop. A second submits a driver whose sizer
grows its job from 1 to 2 replicas and shrinks it back (a grow starts the new replica
while the job trains; each resize checkpoints at a batch boundary and continues from the
checkpoint, keeping the replicas that stay) and checks the same across both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.core.harness import read_events
from tests.exactly_once import assert_exactly_once
from tests.ray.local_cluster import LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO_ROOT / "tests" / "core" / "jobs" / "elastic_job.py"
SIZE, EPOCHS, BATCH = 48, 2, 8

pytest.importorskip("ray.job_submission")


@pytest.fixture(scope="module")
def cluster_env():
    """The environment of the cluster and of the CLI: this tree importable, token
    authentication off on both sides, one thread per process."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ADAPTDL_") and k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(PYTHONPATH=pythonpath, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    # (The CLI keeps the GCS addresses it learns under XDG_CACHE_HOME: not the user's.)
    env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="adaptdl-cli-cache-")
    return env


@pytest.fixture(scope="module")
def cluster(cluster_env):
    with LocalCluster(num_cpus=4, env=cluster_env) as c:
        yield c


def cli(env, cwd, *args, timeout=120):
    """Run ``python -m adaptdl_ray ARGS``; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "adaptdl_ray", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def ended(cluster, submission_id, timeout=120):
    """Wait for a Ray job to end (asked in this process: cheaper than a CLI per poll)."""
    from ray.job_submission import JobSubmissionClient
    client = JobSubmissionClient(cluster.address)
    wait_for(lambda: client.get_job_status(submission_id).is_terminal(), timeout,
             f"the end of {submission_id}")
    return client


def batches(record: Path) -> int:
    return sum(1 for e in read_events(record) if e["event"] == "batch") if record.exists() else 0


def listed(env, cwd, address, name):
    out = cli(env, cwd, "ls", "--json", "--address", address)
    assert out.returncode == 0, out.stderr
    return {row["name"]: row for row in json.loads(out.stdout)}.get(name)


def test_submit_stop_resume_exactly_once(cluster, cluster_env, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOB_SCRIPT, work / "tiny.py")
    record, storage = tmp_path / "record", tmp_path / "storage"
    record.mkdir()
    # Batches of 2 s until the stop has landed (the file below), then as fast as they go:
    # the stop, a new process importing Ray, lands mid-run however loaded the machine.
    stopped = tmp_path / "stopped"
    submit = ["submit", "--address", cluster.address, "--name", "tiny", "--min-replicas", "2",
              "--max-replicas", "2", "--storage-path", str(storage), "--working-dir", str(work),
              "tiny.py", "--record", str(record), "--epochs", str(EPOCHS), "--size", str(SIZE),
              "--batch-size", str(BATCH), "--sleep", "2.0", "--slow-until", str(stopped)]
    out = cli(cluster_env, tmp_path, *submit)
    assert out.returncode == 0, out.stderr
    assert "submitted job tiny" in out.stdout

    wait_for(lambda: batches(record) >= 2, 90, "the job's first batches")
    out = cli(cluster_env, tmp_path, "stop", "--address", cluster.address, "tiny")
    assert out.returncode == 0, out.stderr
    assert "stopped job tiny" in out.stdout, out.stdout
    # (Each of the 2 replicas records every step.)
    assert 0 < batches(record) < 2 * EPOCHS * SIZE // BATCH, "the stop did not come mid-run"
    stopped.touch()
    assert listed(cluster_env, tmp_path, cluster.address, "tiny")["status"] == "stopped"

    out = cli(cluster_env, tmp_path, *submit)
    assert out.returncode == 0, out.stderr
    # While it runs, a second submission of its name is refused, in one line with the fix.
    again = cli(cluster_env, tmp_path, *submit)
    assert again.returncode == 1
    assert "already running" in again.stderr and "adaptdl-ray stop tiny" in again.stderr
    row = wait_for(lambda: (lambda r: r if r["status"] != "pending" else None)(
        listed(cluster_env, tmp_path, cluster.address, "tiny")), 90, "the resumed job's start")
    assert row["status"] in ("running", "finished"), row
    if row["status"] == "running":
        assert row["replicas"] == 2, row
    ended(cluster, "adaptdl-tiny-2")
    row = listed(cluster_env, tmp_path, cluster.address, "tiny")
    assert row["status"] == "finished" and row["restarts"] == 1, row

    events = read_events(record)
    assert {(e["restart"], e["rank"]) for e in events if e["event"] == "batch"} == \
        {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert_exactly_once(events, SIZE, EPOCHS)

    logs = cli(cluster_env, tmp_path, "logs", "--address", cluster.address, "tiny")
    assert logs.returncode == 0, logs.stderr
    assert "resuming from" in logs.stdout and "restart 1" in logs.stdout

    out = cli(cluster_env, tmp_path, "cp", "--address", cluster.address, "tiny",
              str(tmp_path / "copy"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "copy" / "MANIFEST.json").exists()

    # (Every verb's unknown-job error is checked without a cluster in test_cli_unit.py.)
    out = cli(cluster_env, tmp_path, "logs", "--address", cluster.address, "nope")
    assert out.returncode == 1 and "no job named 'nope'" in out.stderr, out.stderr


def test_resize_keeps_the_replicas_that_stay_and_trains_exactly_once(cluster, cluster_env,
                                                                     tmp_path):
    """1 -> 2 -> 1 replicas: the grow starts one new process and keeps rank 0's; the
    shrink stops the extra one and keeps rank 0's again; every sample once per epoch."""
    from tests.ray.cluster_resize_job import EPOCHS as RESIZE_EPOCHS
    from tests.ray.cluster_resize_job import SIZE as RESIZE_SIZE
    record, storage = tmp_path / "record", tmp_path / "storage"
    record.mkdir()
    from ray.job_submission import JobSubmissionClient
    client = JobSubmissionClient(cluster.address)
    job = client.submit_job(
        entrypoint=f"{sys.executable} -m tests.ray.cluster_resize_job {storage} {record}",
        runtime_env={"env_vars": {"PYTHONPATH": cluster_env["PYTHONPATH"]}})
    ended(cluster, job, 180)
    logs = client.get_job_logs(job)
    assert str(client.get_job_status(job)).endswith("SUCCEEDED"), logs[-3000:]
    assert "resizes begun: [2, 1]" in logs, logs[-3000:]
    events = read_events(record)
    starts = {(e["restart"], e["rank"]): e for e in events if e["event"] == "start"}
    assert {r: e["replicas"] for (r, _), e in starts.items()} == {0: 1, 1: 2, 2: 1}, starts
    pid = {key: e["pid"] for key, e in starts.items()}
    assert pid[(0, 0)] == pid[(1, 0)] == pid[(2, 0)], pid  # rank 0 kept its process
    assert pid[(1, 1)] != pid[(1, 0)], pid                  # the grow started one more
    assert "1 replica(s) stay, 1 start" in logs and "1 replica(s) stay, 0 start" in logs, \
        logs[-3000:]
    assert_exactly_once(events, RESIZE_SIZE, RESIZE_EPOCHS)


def test_start_turns_the_allocators_autoscaling_on_and_off(cluster, cluster_env, tmp_path):
    # (A driver joins by the GCS address: the test's own Ray instance may be the one a
    # dashboard URL of this machine would find.)
    ns = ["--address", cluster.gcs_address, "--namespace", "autoscale-e2e"]
    out = cli(cluster_env, tmp_path, "start", *ns, "--autoscale", "--min-nodes", "1",
              "--max-nodes", "3", "--node-template", '{"CPU": 4}')
    assert out.returncode == 0, out.stderr
    assert "autoscaling: 1 to 3 nodes of" in out.stdout
    status = cli(cluster_env, tmp_path, "status", "--json", *ns)
    assert status.returncode == 0, status.stderr
    autoscale = json.loads(status.stdout)["autoscale"]
    assert autoscale["options"]["max_nodes"] == 3
    # No job: min_nodes, which the 4-CPU head already is; the request asks for it.
    assert autoscale["standing_nodes"] == 1
    assert autoscale["last"]["current_nodes"] == 1
    # Through the dashboard's URL too (the cluster itself says its GCS address), and as a
    # summary for people.
    via_url = cli(cluster_env, tmp_path, "status", "--address", cluster.address,
                  "--namespace", "autoscale-e2e")
    assert via_url.returncode == 0, via_url.stderr
    assert "autoscaling: 1 to 3 nodes of" in via_url.stdout, via_url.stdout
    out = cli(cluster_env, tmp_path, "start", *ns, "--no-autoscale")
    assert out.returncode == 0 and "autoscaling: off" in out.stdout, out.stderr
    status = cli(cluster_env, tmp_path, "status", "--json", *ns)
    assert json.loads(status.stdout)["autoscale"] is None


def _status(storage: Path, name: str) -> dict:
    path = storage / name / "status.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_a_job_grows_into_the_room_a_failed_job_leaves(cluster, cluster_env, tmp_path):
    """Two jobs on 4 CPUs: "hog" holds 3 and fails; "big" (up to 3), started on the one
    left, grows into the room within an allocation round once a growth pays (its step
    time scales with its local batch, so more replicas pay). ls lists the failed job
    with its owner."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOB_SCRIPT, work / "tiny.py")
    storage = tmp_path / "storage"
    common = ["--address", cluster.address, "--storage-path", str(storage),
              "--working-dir", str(work), "--allocation-interval", "3"]
    (tmp_path / "r-hog").mkdir()
    (tmp_path / "r-big").mkdir()
    hog = cli(cluster_env, tmp_path, "submit", *common, "--name", "hog", "--min-replicas", "3",
              "--max-replicas", "3", "tiny.py", "--record", str(tmp_path / "r-hog"),
              "--epochs", "50", "--size", "48", "--sleep", "0.1", "--die-after", "40",
              "--die-rank", "0")
    assert hog.returncode == 0, hog.stderr
    wait_for(lambda: _status(storage, "hog").get("replicas") == 3, 90, "the hog's start")
    big = cli(cluster_env, tmp_path, "submit", *common, "--name", "big", "--max-replicas", "3",
              "tiny.py", "--record", str(tmp_path / "r-big"), "--epochs", "60",
              "--size", "96", "--batch-size", "16", "--sleep-per-sample", "0.01")
    assert big.returncode == 0, big.stderr
    wait_for(lambda: _status(storage, "big").get("replicas") == 1, 90, "big's start on 1")
    ended(cluster, "adaptdl-hog-1", 120)
    failed = time.monotonic()
    wait_for(lambda: (_status(storage, "big").get("replicas") or 0) >= 2, 90,
             "big's growth into the room the hog left")
    grew_after_s = time.monotonic() - failed
    rows = {r["name"]: r for r in json.loads(
        cli(cluster_env, tmp_path, "ls", "--json", "--address", cluster.address).stdout)}
    assert rows["hog"]["status"] == "failed", rows["hog"]
    assert rows["hog"]["owner"] and "@" in rows["hog"]["owner"], rows["hog"]
    assert rows["big"]["replicas"] >= 2, rows["big"]
    stop = cli(cluster_env, tmp_path, "stop", "--address", cluster.address, "big")
    assert stop.returncode == 0, stop.stderr
    # (An allocation round is 3 s; a growth starts its new replica while the job trains.)
    assert grew_after_s < 60, grew_after_s


@pytest.mark.slow
def test_every_address_reaches_this_cluster_beside_a_hung_instance(cluster, cluster_env,
                                                                   tmp_path):
    """Another Ray instance on the machine stops answering (its processes stopped): every
    verb given this cluster's dashboard URL or GCS address, by --address or RAY_ADDRESS,
    still answers at once, and the hung one's address is one line within seconds."""
    hung = LocalCluster(num_cpus=1, env=cluster_env)
    try:
        os.killpg(hung.proc.pid, signal.SIGSTOP)
        env = {k: v for k, v in cluster_env.items() if k != "RAY_ADDRESS"}
        # (`start` first: `status` needs the allocator, whatever ran before this test.)
        calls = [(["start", "--address", cluster.address], env),
                 (["ls", "--json", "--address", cluster.address], env),
                 (["ls", "--json", "--address", cluster.gcs_address], env),
                 (["ls", "--json"], dict(env, RAY_ADDRESS=cluster.address)),
                 (["status", "--address", cluster.address], env)]
        for args, call_env in calls:
            started = time.monotonic()
            out = cli(call_env, tmp_path, *args, timeout=90)
            assert out.returncode == 0, (args, out.stderr[-2000:])
            assert "trials of Tune sweeps are not listed" not in out.stderr, out.stderr
            assert time.monotonic() - started < 60, args
        started = time.monotonic()
        out = cli(env, tmp_path, "ls", "--address", hung.address, timeout=90)
        assert out.returncode == 1
        line = out.stderr.strip().splitlines()[-1]
        assert line.startswith("adaptdl-ray: error: ") and "did not answer" in line, out.stderr
        assert time.monotonic() - started < 30
    finally:
        try:
            os.killpg(hung.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        hung.stop()
