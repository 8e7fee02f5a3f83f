"""adaptdl_core.collective: the single-replica shortcuts in-process, argument checks, and
real multi-process runs of tests/core/jobs/collective_job.py.

To keep the suite fast on a 2-core machine, every multi-process scenario runs at once,
once per module (the ``runs`` fixture): the 2-replica scenario as separate interpreters
started by tests/core/harness.py, the others as replicas forked by one launcher process
(so that torch is imported once); every replica has its own ADAPTDL_* variables and a
scenario's replicas share a port, held from the start (adaptdl_core.ports).
"""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from adaptdl_core import collective
from tests.core import harness

JOB = harness.JOBS / "collective_job.py"
TIMEOUT_S = 3.0
# The scenarios that do not test the timeout get a long one: on a loaded machine a replica
# may start seconds after another, and an error that came only at the timeout would show.
OPS_TIMEOUT_S = 60.0
# Generous: the test machines are small and shared.
MARGIN_S = 12.0
LIMIT_S = 60.0

# name -> (mode, replicas, absent ranks, hanging ranks); run by the forking launcher.
FORKED = {
    "ops3": ("ops", 3, "", ""),
    "timeout4": ("timeout", 4, "2", "3"),
    "timeout2": ("timeout", 2, "1", ""),
    "hostdies": ("hostdies", 2, "", ""),
    "lastread": ("lastread", 2, "", ""),
    "noread": ("noread", 3, "2", ""),
}


# -- one replica, in this process ----------------------------------------------------------

def test_single_replica_without_initialize_returns_the_value():
    assert not collective.is_initialized()
    calls = []

    def reduce_fn(a, b):
        calls.append((a, b))
        return a

    assert collective.allreduce(5) == 5
    assert collective.allreduce({"a": 1}, reduce_fn) == {"a": 1}
    assert collective.broadcast([1, 2]) == [1, 2]
    future = collective.allreduce_async("x", reduce_fn)
    assert isinstance(future, concurrent.futures.Future)
    assert future.done() and future.result(timeout=0) == "x"
    assert calls == []  # nothing to reduce with one value
    assert not collective.is_initialized()


def test_several_replicas_without_initialize_raise(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    for call in (lambda: collective.allreduce(1), lambda: collective.allreduce_async(1),
                 lambda: collective.broadcast(1), collective.store_address,
                 collective.new_store_client):
        with pytest.raises(RuntimeError, match="not initialized"):
            call()


def test_initialize_single_replica_store_and_twice_raises():
    collective.initialize(master_port=0, replica_rank=0, num_replicas=1, timeout=5)
    try:
        assert collective.is_initialized()
        addr, port = collective.store_address()
        assert addr == "127.0.0.1" and 0 < port <= 65535  # port 0 picked a free one
        with pytest.raises(RuntimeError, match="already initialized"):
            collective.initialize(master_port=0, replica_rank=0, num_replicas=1)
        # The reduction of one value is that value, without store round trips (these run
        # at every batch boundary: a job of size 1 has nobody to exchange with).
        assert collective.allreduce(7, lambda a, b: a * b) == 7
        assert collective.allreduce_async([1]).result(timeout=10) == [1]
        assert collective.broadcast("b") == "b"
        assert collective.current_group().op == 0
    finally:
        collective.teardown()
    assert not collective.is_initialized()
    collective.teardown()  # a second teardown is harmless
    assert collective.allreduce(3) == 3


def test_initialize_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ADAPTDL_TIMEOUT", "4.5")
    collective.initialize()
    try:
        group = collective.current_group()
        assert (group.rank, group.size, group.timeout_s) == (0, 1, 4.5)
    finally:
        collective.teardown()


@pytest.mark.parametrize("kwargs,word", [
    (dict(master_port=0, replica_rank=0, num_replicas=2), "master_port=0"),
    (dict(master_port=0, replica_rank=1, num_replicas=3), "master_port=0"),
    (dict(master_port=-1), "master_port"),
    (dict(master_port=70000), "master_port"),
    (dict(master_port="29500"), "master_port"),
    (dict(num_replicas=0), "num_replicas"),
    (dict(num_replicas="2"), "num_replicas"),
    (dict(replica_rank=-1), "replica_rank"),
    (dict(replica_rank=2, num_replicas=2, master_port=12345), "replica_rank"),
    (dict(replica_rank=0.0), "replica_rank"),
    (dict(timeout=0), "timeout"),
    (dict(timeout=-3), "timeout"),
])
def test_initialize_rejects_bad_arguments(kwargs, word):
    with pytest.raises(ValueError) as info:
        collective.initialize(**kwargs)
    assert word in str(info.value)
    assert not collective.is_initialized()


def test_master_port_zero_from_environment_with_several_replicas(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    with pytest.raises(ValueError, match="ADAPTDL_MASTER_PORT"):
        collective.initialize()
    assert not collective.is_initialized()


def test_invalid_environment_is_reported(monkeypatch):
    monkeypatch.setenv("ADAPTDL_TIMEOUT", "never")
    with pytest.raises(ValueError, match="ADAPTDL_TIMEOUT"):
        collective.initialize()


# -- several processes ---------------------------------------------------------------------

class Runs:
    """Reports and exit statuses of the multi-process scenarios."""

    def __init__(self, root):
        self.root = root
        self.statuses = {}
        self.outputs = {}

    def reports(self, name):
        """The JSON report of each rank (None where a rank wrote none); fails if any rank
        of the scenario exited with a non-zero status."""
        statuses = self.statuses.get(name)
        assert statuses, f"scenario {name} did not run:\n{self.outputs}"
        bad = {rank: code for rank, code in statuses.items() if code != 0}
        assert not bad, f"scenario {name}: ranks exited with {bad}:\n{self.outputs[name]}"
        out = self.root / name
        return [json.loads((out / f"rank{r}.json").read_text())
                if (out / f"rank{r}.json").exists() else None for r in range(len(statuses))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("collective")
    result = Runs(root)
    spec = [{"name": name, "mode": mode, "replicas": replicas,
             "absent": absent, "hang": hang,
             "env": {"ADAPTDL_TIMEOUT": str(OPS_TIMEOUT_S if mode in ("ops", "lastread",
                                                                   "hostdies")
                                            else TIMEOUT_S)}}
            for name, (mode, replicas, absent, hang) in FORKED.items()]
    (root / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # Into a file, not a pipe: the store's warnings are long and nobody reads a pipe while
    # the harness replicas run.
    log = open(root / "launcher.log", "w")
    launcher = subprocess.Popen(
        [sys.executable, str(JOB), "launch", "--spec", str(root / "spec.json"),
         "--out", str(root), "--limit", str(LIMIT_S)],
        env=env, cwd=harness.JOBS.parent.parent.parent, stdout=log,
        stderr=subprocess.STDOUT, text=True)
    # Two separate interpreters, started like a real job, at the same time.
    (root / "ops2").mkdir()
    procs = harness.start_replicas(JOB, 2, root / "ckpt", 0, ["ops", "--out", str(root / "ops2")],
                                   {"ADAPTDL_TIMEOUT": str(OPS_TIMEOUT_S)})
    harness_results = harness.wait_all(procs, timeout=LIMIT_S + 30)
    result.statuses["ops2"] = {str(r): status for r, (status, _) in enumerate(harness_results)}
    result.outputs["ops2"] = "\n".join(out for _, out in harness_results)
    try:
        launcher.wait(timeout=LIMIT_S + 30)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()
    log.close()
    output = (root / "launcher.log").read_text()
    for name in FORKED:
        result.outputs[name] = output
    statuses_file = root / "statuses.json"
    if statuses_file.exists():
        result.statuses.update(json.loads(statuses_file.read_text()))
    return result


@pytest.mark.parametrize("name,replicas", [("ops2", 2), ("ops3", 3)])
def test_multi_process_operations(runs, name, replicas):
    reports = runs.reports(name)
    ranks = range(replicas)
    ports = {tuple(r["store_address"]) for r in reports}
    assert len(ports) == 1 and ports.pop()[1] > 0
    for rank, r in enumerate(reports):
        assert "not initialized" in r["not_initialized"]
        assert r["is_initialized"] is True and r["after_teardown"] is False
        assert "already initialized" in r["initialize_twice"]
        assert r["sum"] == sum(k + 1 for k in ranks)
        assert r["concat"] == "".join(str(k) for k in ranks)  # folded in rank order
        nested = [0]
        for k in range(1, replicas):
            nested = [nested, [k]]
        assert r["pairs"] == nested
        assert r["max"] == {"rank": 0, "v": 0}
        assert r["sync_between"] == 10 * sum(ranks)
        # Outstanding async operations each got their own contributions, in order.
        expected = [[[i, k] for k in ranks] for i in range(5)]
        expected += [{str(k): i for k in ranks} for i in range(5, 8)]
        assert r["async"] == expected
        assert r["broadcast"] == {"from": 0, "payload": [0, 1, 2]}
        assert r["broadcast_none"] is None
        assert r["big"] == 200_000 * replicas


def test_missing_replicas_make_the_others_time_out(runs):
    """Four replicas: rank 2 exits right after joining and rank 3 never calls the
    collective; ranks 0 and 1 must raise CollectiveTimeoutError naming ranks 2 and 3,
    after about ADAPTDL_TIMEOUT seconds."""
    reports = runs.reports("timeout4")
    assert reports[2] is None and reports[3] == {"hung": True}
    for rank in (0, 1):
        r = reports[rank]
        assert r["type"] == "CollectiveTimeoutError", r
        assert r["missing"] == [2, 3]
        assert "replicas 2 and 3 of 4" in r["message"] and "ADAPTDL_TIMEOUT" in r["message"]
        assert f"replica {rank}" in r["message"]
        assert TIMEOUT_S * 0.9 <= r["elapsed"] < TIMEOUT_S + MARGIN_S, r


def test_one_missing_replica_of_two(runs):
    reports = runs.reports("timeout2")
    r = reports[0]
    assert r["type"] == "CollectiveTimeoutError" and r["missing"] == [1], r
    assert "replica 1 of 2" in r["message"]
    assert TIMEOUT_S * 0.9 <= r["elapsed"] < TIMEOUT_S + MARGIN_S


def test_store_host_exiting_is_a_collective_error_at_once_not_a_timeout(runs):
    r = runs.reports("hostdies")[1]
    assert r["type"] == "CollectiveError", r
    assert "replica 0" in r["message"]
    # The scenario's timeout is OPS_TIMEOUT_S: an error that waited for it would come a
    # minute after the host left (0.3 s after rank 1 began to wait); a quarter of it
    # leaves a loaded machine ample room.
    assert r["elapsed"] < OPS_TIMEOUT_S / 4, r


def test_store_host_waits_for_the_last_collective_to_be_read(runs):
    r0, r1 = runs.reports("lastread")
    assert r0 == {"type": None, "value": 3}
    assert r1 == {"type": None, "value": 3}, r1


def test_store_host_does_not_wait_forever_for_a_replica_that_never_reads(runs):
    """Rank 2 publishes its value and dies before reading the result: replica 0 gives up
    after about ADAPTDL_TIMEOUT seconds with an error naming rank 2; rank 1 gets the
    value."""
    r0, r1, r2 = runs.reports("noread")
    assert r2 is None
    assert r1["type"] is None and r1["value"] == 6, r1
    assert r0["type"] == "CollectiveTimeoutError" and r0["missing"] == [2], r0
    assert "replica 2 of 3" in r0["message"] and "did not read" in r0["message"]
    assert TIMEOUT_S * 0.9 <= r0["elapsed"] < TIMEOUT_S + MARGIN_S, r0
