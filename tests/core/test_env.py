"""adaptdl_core.env: documented defaults, values read from the environment, and the
ValueError (naming the variable) for every kind of invalid value."""

import os

import pytest

from adaptdl_core import env


def test_no_adaptdl_variables_leak_into_tests():
    # The autouse fixture in tests/conftest.py must have cleared them.
    assert [k for k in os.environ if k.startswith("ADAPTDL_")] == []


def test_defaults():
    assert env.checkpoint_path() is None
    assert env.share_path() is None
    assert env.job_id() is None
    assert env.master_addr() == "127.0.0.1"
    assert env.master_port() == 0
    assert env.replica_rank() == 0
    assert env.num_replicas() == 1
    assert env.num_nodes() == 1
    assert env.num_restarts() == 0
    assert env.timeout() == 30
    assert isinstance(env.timeout(), float)
    assert env.DEFAULT_TIMEOUT_S == 30


def test_num_nodes_defaults_to_num_replicas(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "6")
    assert env.num_nodes() == 6
    monkeypatch.setenv("ADAPTDL_NUM_NODES", "2")
    assert env.num_nodes() == 2


@pytest.mark.parametrize("name", ["ADAPTDL_SHARE_PATH",
                                  "ADAPTDL_JOB_ID", "ADAPTDL_NUM_REPLICAS",
                                  "ADAPTDL_MASTER_PORT", "ADAPTDL_TIMEOUT",
                                  "ADAPTDL_MASTER_ADDR", "ADAPTDL_REPLICA_RANK",
                                  "ADAPTDL_NUM_NODES", "ADAPTDL_NUM_RESTARTS"])
def test_empty_value_means_default(monkeypatch, name):
    # (ADAPTDL_CHECKPOINT_PATH set but empty is refused: tests/core/test_bad_input_env.py.)
    before = {f: getattr(env, f)() for f in ("checkpoint_path", "share_path", "job_id",
                                              "num_replicas", "master_port", "timeout",
                                              "master_addr", "replica_rank", "num_nodes",
                                              "num_restarts")}
    monkeypatch.setenv(name, "")
    after = {f: getattr(env, f)() for f in before}
    assert after == before


def test_values_are_read_from_the_environment(monkeypatch, tmp_path):
    values = {
        "ADAPTDL_CHECKPOINT_PATH": str(tmp_path / "ck"),
        "ADAPTDL_SHARE_PATH": str(tmp_path / "share"),
        "ADAPTDL_JOB_ID": "job-42",
        "ADAPTDL_MASTER_ADDR": "10.1.2.3",
        "ADAPTDL_MASTER_PORT": "29511",
        "ADAPTDL_NUM_REPLICAS": "4",
        "ADAPTDL_REPLICA_RANK": "3",
        "ADAPTDL_NUM_NODES": "2",
        "ADAPTDL_NUM_RESTARTS": "7",
        "ADAPTDL_TIMEOUT": "2.5",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    assert env.checkpoint_path() == str(tmp_path / "ck")
    assert env.share_path() == str(tmp_path / "share")
    assert env.job_id() == "job-42"
    assert env.master_addr() == "10.1.2.3"
    assert env.master_port() == 29511
    assert env.num_replicas() == 4
    assert env.replica_rank() == 3
    assert env.num_nodes() == 2
    assert env.num_restarts() == 7
    assert env.timeout() == 2.5


def test_values_are_not_cached(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    assert env.num_replicas() == 2
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "5")
    assert env.num_replicas() == 5
    monkeypatch.delenv("ADAPTDL_NUM_REPLICAS")
    assert env.num_replicas() == 1


def test_surrounding_whitespace_is_accepted(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", " 3 ")
    monkeypatch.setenv("ADAPTDL_TIMEOUT", " 4 ")
    assert env.num_replicas() == 3
    assert env.timeout() == 4.0


def test_boundary_values_are_valid(monkeypatch):
    monkeypatch.setenv("ADAPTDL_MASTER_PORT", "65535")
    assert env.master_port() == 65535
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "3")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "2")
    monkeypatch.setenv("ADAPTDL_NUM_NODES", "3")
    assert env.replica_rank() == 2
    assert env.num_nodes() == 3
    monkeypatch.setenv("ADAPTDL_TIMEOUT", "0.001")
    assert env.timeout() == 0.001


# (variable, value, function, other variables)
INVALID = [
    ("ADAPTDL_NUM_REPLICAS", "two", "num_replicas", {}),
    ("ADAPTDL_NUM_REPLICAS", "1.5", "num_replicas", {}),
    ("ADAPTDL_NUM_REPLICAS", "0", "num_replicas", {}),
    ("ADAPTDL_NUM_REPLICAS", "-2", "num_replicas", {}),
    ("ADAPTDL_REPLICA_RANK", "x", "replica_rank", {}),
    ("ADAPTDL_REPLICA_RANK", "-1", "replica_rank", {}),
    ("ADAPTDL_REPLICA_RANK", "1", "replica_rank", {}),  # rank >= replicas (default 1)
    ("ADAPTDL_REPLICA_RANK", "4", "replica_rank", {"ADAPTDL_NUM_REPLICAS": "4"}),
    ("ADAPTDL_NUM_NODES", "3", "num_nodes", {"ADAPTDL_NUM_REPLICAS": "2"}),
    ("ADAPTDL_NUM_NODES", "2", "num_nodes", {}),  # nodes > replicas (default 1)
    ("ADAPTDL_NUM_NODES", "0", "num_nodes", {}),
    ("ADAPTDL_NUM_NODES", "many", "num_nodes", {}),
    ("ADAPTDL_NUM_RESTARTS", "-1", "num_restarts", {}),
    ("ADAPTDL_NUM_RESTARTS", "3rd", "num_restarts", {}),
    ("ADAPTDL_MASTER_PORT", "http", "master_port", {}),
    ("ADAPTDL_MASTER_PORT", "-1", "master_port", {}),
    ("ADAPTDL_MASTER_PORT", "65536", "master_port", {}),
    ("ADAPTDL_MASTER_PORT", "80.5", "master_port", {}),
    ("ADAPTDL_TIMEOUT", "soon", "timeout", {}),
    ("ADAPTDL_TIMEOUT", "0", "timeout", {}),
    ("ADAPTDL_TIMEOUT", "-5", "timeout", {}),
    ("ADAPTDL_TIMEOUT", "nan", "timeout", {}),
]


@pytest.mark.parametrize("name,value,func,others", INVALID,
                         ids=[f"{n[8:]}={v}" for n, v, _, _ in INVALID])
def test_invalid_values_raise_value_error_naming_the_variable(monkeypatch, name, value,
                                                              func, others):
    for k, v in others.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        getattr(env, func)()
    assert name in str(info.value)


def test_invalid_replica_count_is_reported_by_dependent_functions(monkeypatch):
    # replica_rank() and num_nodes() read ADAPTDL_NUM_REPLICAS: its error must surface.
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "zero")
    for func in (env.replica_rank, env.num_nodes):
        with pytest.raises(ValueError, match="ADAPTDL_NUM_REPLICAS"):
            func()


def test_rank_error_names_both_variables(monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "2")
    with pytest.raises(ValueError) as info:
        env.replica_rank()
    assert "ADAPTDL_REPLICA_RANK=2" in str(info.value)
    assert "ADAPTDL_NUM_REPLICAS=2" in str(info.value)


def test_infinite_timeout_is_rejected(monkeypatch):
    monkeypatch.setenv("ADAPTDL_TIMEOUT", "inf")
    with pytest.raises(ValueError, match="ADAPTDL_TIMEOUT"):
        env.timeout()
