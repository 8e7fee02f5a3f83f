"""Bad input to the simulator and its command line: every case ends at once with
exit status 2 and a message naming the argument (before any simulation), never with a run
that cannot end, a negative makespan or a result lost to an unwritable ``--out``."""

from __future__ import annotations

import json
import shutil

import pytest

import adaptdl_core.sim.__main__ as cli
from adaptdl_core.sim import output
from adaptdl_core.sim.cluster import MIN_INTERVAL_S, WorkloadJob, load_workload, simulate
from adaptdl_core.sim.job_model import TRACES_DIR, get_application

HEADER = "name,time,application,num_replicas,batch_size\n"


def write_workload(tmp_path, *rows):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return str(path)


def run_cli(capsys, *argv):
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def no_simulation(monkeypatch):
    """Fails the test if the command line starts a simulation: bad input must be found
    before one runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("the simulation ran")

    monkeypatch.setattr(cli, "simulate", refuse)


# -- the cluster subcommand ------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--interval", "1e-6"], "interval must be a finite number of seconds >= 1, got 1e-06"),
    (["--interval", "0"], "interval must be"),
    (["--interval", "inf"], "interval must be"),
    (["--interval", "nan"], "interval must be"),
    (["--interference", "5"], r"interference must be a slowdown fraction in [0, 1), got 5.0"),
    (["--interference", "1"], "interference must be"),
    (["--interference", "-0.1"], "interference must be"),
    (["--max-time", "-5"], "max_time must be None or a finite number of seconds > 0, got -5.0"),
    (["--max-time", "0"], "max_time must be"),
    (["--restart-s", "-1"], "restart_s must be"),
    (["--nodes", "0"], "nodes must be an integer >= 1, got 0"),
    (["--gpus-per-node", "-4"], "gpus_per_node must be an integer >= 1"),
])
def test_cluster_rejects_bad_settings_before_simulating(capsys, extra, message, monkeypatch):
    # simulate() runs with its real checks; a simulation would start by loading the workload.
    from adaptdl_core.sim import cluster

    monkeypatch.setattr(cluster, "load_workload",
                        lambda spec: pytest.fail(f"the simulation started with {extra}"))
    status, out, err = run_cli(capsys, "cluster", "--workload", "load-1.0/workload-1",
                               "--policy", "tiresias", *extra)
    assert status == 2 and out == ""
    assert message in err


def test_the_interval_bound_is_the_documented_one():
    assert MIN_INTERVAL_S == 1.0
    with pytest.raises(ValueError, match=r"interval must be .* got 0\.5: shorter rounds"):
        simulate("load-1.0/workload-1", "tiresias", interval=0.5)


@pytest.mark.parametrize("row, message", [
    ("j0,0,cifar10,0,128", "row 1 malformed (num_replicas must be an integer >= 1, got 0)"),
    ("j0,0,cifar10,-2,128", "num_replicas must be an integer >= 1, got -2"),
    ("j0,0,cifar10,1,0", "row 1 malformed (batch_size must be an integer >= 1, got 0)"),
    ("j0,-5,cifar10,1,128", "time must be a finite number of seconds >= 0, got -5.0"),
    ("j0,nan,cifar10,1,128", "time must be"),
    (",0,cifar10,1,128", "name must be a non-empty string"),
])
@pytest.mark.parametrize("policy", ["tiresias", "optimus", "pollux"])
def test_cluster_rejects_bad_workload_rows(capsys, tmp_path, no_simulation, row, message,
                                           policy, monkeypatch):
    # The real simulate() loads the workload first; it must stop there.
    monkeypatch.setattr(cli, "simulate", _loads_only)
    path = write_workload(tmp_path, row)
    status, out, err = run_cli(capsys, "cluster", "--workload", path, "--policy", policy)
    assert status == 2 and out == ""
    assert message in err and path in err


def _loads_only(workload, policy, **kwargs):
    load_workload(workload)
    raise AssertionError("the workload was accepted")


def test_a_job_of_zero_replicas_cannot_be_simulated():
    """It once ran forever (tiresias never gave the job a GPU, so it never finished)."""
    with pytest.raises(ValueError, match="num_replicas must be an integer >= 1, got 0"):
        WorkloadJob("j0", 0.0, "cifar10", 0, 128)


def test_a_binary_workload_is_named(capsys, tmp_path, no_simulation, monkeypatch):
    monkeypatch.setattr(cli, "simulate", _loads_only)
    path = tmp_path / "binary.csv"
    path.write_bytes(bytes(range(128, 256)) * 4)
    status, out, err = run_cli(capsys, "cluster", "--workload", str(path), "--policy",
                               "tiresias")
    assert status == 2
    assert f"workload {str(path)!r} is not a UTF-8 CSV file" in err


def test_a_binary_trace_file_is_named(tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(TRACES_DIR / "cifar10", traces / "cifar10")
    (traces / "cifar10" / "placements.csv").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=r"trace file .*placements\.csv' is not a UTF-8 CSV"):
        get_application("cifar10", traces)


# -- --out -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing" / "r.json", "does not exist; create the directory first"),
    (lambda d: d / "file.txt" / "r.json", "is not a directory"),
    (lambda d: d, "is a directory"),
])
@pytest.mark.parametrize("command", ["cluster", "sweep"])
def test_an_unwritable_out_is_found_before_the_simulation(capsys, tmp_path, no_simulation,
                                                          monkeypatch, make, message,
                                                          command):
    import adaptdl_core.sim.sweep as sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda **kw: pytest.fail("the sweep ran"))
    (tmp_path / "file.txt").write_text("x")
    out_path = make(tmp_path)
    argv = (["cluster", "--workload", "load-1.0/workload-1", "--policy", "tiresias"]
            if command == "cluster" else ["sweep"])
    status, out, err = run_cli(capsys, *argv, "--out", str(out_path))
    assert status == 2 and out == ""
    assert f"--out {str(out_path)!r}" in err and message in err
    assert not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # nothing left behind


def test_a_write_that_still_fails_puts_the_result_on_stdout(capsys, tmp_path, monkeypatch):
    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "write_json", disk_full)
    out_path = tmp_path / "r.json"
    status, out, err = run_cli(capsys, "cluster", "--workload", "load-1.0/workload-1",
                               "--policy", "tiresias", "--max-time", "600", "--out",
                               str(out_path))
    assert status == 1
    assert f"could not write {str(out_path)!r}" in err and "No space left" in err
    result = json.loads(out[out.index("{"):])
    assert result["policy"] == "tiresias" and result["makespan"] > 0


def test_a_valid_run_still_writes_its_result(capsys, tmp_path):
    out_path = tmp_path / "r.json"
    status, out, err = run_cli(capsys, "cluster", "--workload", "load-1.0/workload-1",
                               "--policy", "tiresias", "--max-time", "600", "--out",
                               str(out_path))
    assert status == 0, err
    data = json.loads(out_path.read_text())
    assert data["settings"]["interval"] == 60.0 and data["makespan"] > 0


# -- the sweep subcommand --------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--interval", "--tick-s"])
def test_sweep_rejects_steps_below_a_second(capsys, flag):
    status, out, err = run_cli(capsys, "sweep", "--trials", "2", flag, "1e-6")
    assert status == 2
    assert f"{flag[2:].replace('-', '_')} must be >= 1 s, got 1e-06" in err
