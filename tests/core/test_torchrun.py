"""An unchanged adaptdl_core script under torchrun: torchrun's variables stand in for unset
ADAPTDL_* ones, the collectives share torchrun's agent store without reading an earlier
round's keys, and a SIGTERM to torchrun checkpoints the job at a batch boundary, from which
a torchrun with another number of processes resumes it exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from adaptdl_core import env, ports
from tests.core.harness import JOBS, read_events
from tests.exactly_once import assert_exactly_once

JOB = JOBS / "elastic_job.py"
SIZE = 96

TORCHRUN_VARS = {"TORCHELASTIC_RUN_ID": "run-7", "RANK": "1", "WORLD_SIZE": "3",
                 "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29999", "GROUP_WORLD_SIZE": "2",
                 "TORCHELASTIC_RESTART_COUNT": "2", "LOCAL_RANK": "1"}


@pytest.fixture
def no_torchrun(monkeypatch):
    """No torchrun variable from the environment the tests run in."""
    for name in (*TORCHRUN_VARS, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_torchrun_variables_stand_in_for_unset_adaptdl_ones(no_torchrun):
    for name, value in TORCHRUN_VARS.items():
        no_torchrun.setenv(name, value)
    assert env.under_torchrun()
    assert (env.replica_rank(), env.num_replicas(), env.num_nodes()) == (1, 3, 2)
    assert (env.master_addr(), env.master_port()) == ("10.0.0.5", 29999)
    assert (env.num_restarts(), env.local_rank()) == (2, 1)


def test_adaptdl_variables_win(no_torchrun):
    for name, value in TORCHRUN_VARS.items():
        no_torchrun.setenv(name, value)
    no_torchrun.setenv("ADAPTDL_NUM_REPLICAS", "5")
    no_torchrun.setenv("ADAPTDL_REPLICA_RANK", "4")
    no_torchrun.setenv("ADAPTDL_MASTER_PORT", "31000")
    no_torchrun.setenv("ADAPTDL_NUM_RESTARTS", "0")
    assert (env.replica_rank(), env.num_replicas(), env.master_port()) == (4, 5, 31000)
    assert env.num_restarts() == 0
    assert env.master_addr() == "10.0.0.5"  # (not set as ADAPTDL_*: torchrun's)


def test_plain_names_are_ignored_outside_torchrun(no_torchrun):
    for name, value in TORCHRUN_VARS.items():
        if name != "TORCHELASTIC_RUN_ID":
            no_torchrun.setenv(name, value)
    assert not env.under_torchrun()
    assert (env.replica_rank(), env.num_replicas(), env.master_port()) == (0, 1, 0)
    assert env.master_addr() == "127.0.0.1" and env.num_restarts() == 0


def test_bad_torchrun_value_names_torchrun_variable(no_torchrun):
    no_torchrun.setenv("TORCHELASTIC_RUN_ID", "r")
    no_torchrun.setenv("WORLD_SIZE", "2")
    no_torchrun.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2 must be < WORLD_SIZE=2"):
        env.replica_rank()
    no_torchrun.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one' is not an integer"):
        env.replica_rank()
    no_torchrun.setenv("LOCAL_RANK", "-1")
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer >= 0, got -1"):
        env.local_rank()


def test_shared_store_scope(no_torchrun):
    assert env.shared_store_scope() is None
    no_torchrun.setenv("TORCHELASTIC_RUN_ID", "run-7")
    assert env.shared_store_scope() is None          # agent store not shared
    no_torchrun.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert env.shared_store_scope() == "torchrun/run-7"
    no_torchrun.setenv("ADAPTDL_MASTER_PORT", "31000")
    assert env.shared_store_scope() is None          # the job's own port: no launcher store


REPLICA = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
logging.getLogger("adaptdl_core.collective").setLevel(logging.DEBUG)
from adaptdl_core import collective, env
collective.initialize()
total = collective.allreduce(env.replica_rank() + 1)
print(json.dumps({"sum": total, "port": collective.store_address()[1]}))
collective.teardown()
"""


@pytest.mark.parametrize("stale", ["gone", "other"])
def test_replicas_find_this_rounds_store_through_the_agent_store(no_torchrun, stale):
    # The test plays torchrun's agent: it hosts the store named by MASTER_PORT, which
    # still holds an earlier round's entry, naming a store that is gone, or a port that
    # another store took since (with another identifier).
    agent = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    other = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    other.set("adaptdl/store-id", b"another-job")
    gone = ports.HeldPort()  # held and refusing connections, as a store that is gone
    stale_port = gone.port if stale == "gone" else other.port
    key = "adaptdl/torchrun/run-7/store"
    agent.set(key, json.dumps({"port": stale_port, "id": "an-earlier-round"}).encode())
    base = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    base.update(TORCHELASTIC_RUN_ID="run-7", TORCHELASTIC_USE_AGENT_STORE="True",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port), WORLD_SIZE="2",
                ADAPTDL_TIMEOUT="30", OMP_NUM_THREADS="1")
    procs, early = [], []
    for rank in (1, 0):
        procs.append(subprocess.Popen([sys.executable, "-c", REPLICA], text=True,
                                      env={**base, "RANK": str(rank)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        if rank == 1:
            # Replica 0 starts only once replica 1 has found the stale entry wanting.
            for line in procs[0].stdout:
                early.append(line)
                if "is not this round's" in line:
                    break
            assert "is not this round's" in "".join(early), "".join(early)[-3000:]
    results = []
    for proc, before in zip(procs, ("".join(early), "")):
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, (before + out)[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["sum"] for r in results] == [3, 3]
    port = results[0]["port"]
    assert results[1]["port"] == port and port not in (agent.port, stale_port)
    assert json.loads(agent.get(key).decode())["port"] == port
    gone.close()


def _torchrun(tmp_path, nproc, *args, extra=()):
    """Start ``elastic_job.py`` under torchrun (standalone, ``nproc`` processes)."""
    env_vars = {k: v for k, v in os.environ.items()
                if not k.startswith(("ADAPTDL_", "TORCHELASTIC_"))}
    env_vars.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    ADAPTDL_CHECKPOINT_PATH=str(tmp_path / "ckpt"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *extra, str(JOB), "--record", str(tmp_path),
           "--size", str(SIZE), *args]
    return subprocess.Popen(cmd, env=env_vars, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout=60):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.mark.slow
def test_sigterm_to_torchrun_checkpoints_then_one_process_resumes_exactly_once(tmp_path):
    marker = tmp_path / "started"
    # (0.2 s a batch: training lasts several seconds after the first batch, far longer
    # than torchrun takes to forward the signal, even on a busy machine.)
    proc = _torchrun(tmp_path, 2, "--signal-file", str(marker), "--sleep", "0.2")
    deadline = time.time() + 40
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), _finish(proc)[1][-4000:]
    proc.send_signal(signal.SIGTERM)
    status, out = _finish(proc)
    assert status != 0, "torchrun should report the stop"
    assert "exiting with status 143" in out, out[-4000:]
    assert any(p.name.startswith("checkpoint-") for p in (tmp_path / "ckpt").iterdir())
    before = [e for e in read_events(tmp_path) if e["event"] == "batch" and e["rank"] == 0]

    status, out = _finish(_torchrun(tmp_path, 1))
    assert status == 0, out[-4000:]
    events = read_events(tmp_path)
    assert_exactly_once(events, SIZE, epochs=3)
    starts = [e["replicas"] for e in events if e["event"] == "start" and e["rank"] == 0]
    assert starts == [2, 1]
    # The one-process run starts at the sample where the two-process run stopped.
    rank0 = [e for e in events if e["event"] == "batch" and e["rank"] == 0]
    after = rank0[len(before)]
    assert after["local_bsz"] == 8 and after["epoch"] == before[-1]["epoch"]
    assert after["index"] == before[-1]["index"] + 8 or before[-1]["index"] == SIZE


@pytest.mark.slow
def test_torchrun_restart_resumes_from_the_checkpoint(tmp_path):
    # Replica 1 stops the job after 20 steps (status 143, a failure to torchrun), which
    # restarts both workers: they resume from the checkpoint in the same agent store.
    status, out = _finish(_torchrun(tmp_path, 2, "--stop-after", "20", "--stop-rank", "1",
                                    extra=("--max-restarts=1",)))
    assert status == 0, out[-4000:]
    events = read_events(tmp_path)
    assert_exactly_once(events, SIZE, epochs=3)
    starts = sorted((e["restart"], e["replicas"]) for e in events
                    if e["event"] == "start" and e["rank"] == 0)
    assert starts == [(0, 2), (1, 2)]
