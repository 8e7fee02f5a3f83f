"""``adaptdl-ray`` without a cluster: parsing, the errors a user meets (one line each,
with the fix, exit status 1), and what each verb does against a stand-in Job Submission
client."""

from __future__ import annotations

import json
import logging
import socket
import types
from pathlib import Path

import pytest

from adaptdl_ray import cli
from adaptdl_ray.cli import cluster as cli_cluster
from adaptdl_ray.cli import gcs_address, job_verbs, listing
from adaptdl_ray.cluster.job_files import JobFiles
from adaptdl_ray.cluster.owner import current_owner

VERBS = ("submit", "ls", "logs", "stop", "cp", "tensorboard", "start", "status")


def run(capsys, *argv):
    """``adaptdl-ray ARGV`` in this process: (exit status, stdout, stderr)."""
    status = cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptdl-ray: error: "), err
    return lines[0]


@pytest.fixture(autouse=True)
def _ray_logger_level_restored():
    """The CLI joins Ray with logging_level=WARNING, which sets the "ray" logger for the
    whole process: put it back, so that later tests see Ray's default."""
    logger = logging.getLogger("ray")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


class FakeJob:
    def __init__(self, name, sid, status, start, storage="", owner=None):
        self.submission_id = sid
        self.status = status
        self.start_time = start
        self.metadata = {"adaptdl_name": name, "adaptdl_storage_path": storage,
                         "adaptdl_owner": owner or current_owner()}


class FakeClient:
    """A stand-in JobSubmissionClient holding a list of jobs."""

    def __init__(self, jobs=()):
        self.jobs = list(jobs)
        self.submitted = []
        self.stopped = []

    def list_jobs(self):
        return list(self.jobs) + [types.SimpleNamespace(submission_id=None, metadata={},
                                                        status="RUNNING", start_time=0)]

    def submit_job(self, **kwargs):
        if any(j.submission_id == kwargs["submission_id"] for j in self.jobs):
            raise RuntimeError(f"Job with submission_id {kwargs['submission_id']} already exists")
        self.submitted.append(kwargs)
        return kwargs["submission_id"]

    def get_job_logs(self, sid):
        return f"logs of {sid}\n"

    def stop_job(self, sid):
        self.stopped.append(sid)
        for job in self.jobs:
            if job.submission_id == sid:
                job.status = "STOPPED"

    async def tail_job_logs(self, sid):
        for chunk in (f"first of {sid}\n", "second\n"):
            yield chunk

    def get_job_info(self, sid):
        return next(j for j in self.jobs if j.submission_id == sid)


@pytest.fixture
def fake(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(cli_cluster.Cluster, "jobs", lambda self: client)
    monkeypatch.setattr(listing, "allocator_rows", lambda cluster: [])
    return client


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([verb, "--help"])
    assert exc.value.code == 0
    assert f"usage: adaptdl-ray {verb}" in capsys.readouterr().out


def test_python_dash_m_runs_the_same_command():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "adaptdl_ray", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "submit" in out.stdout and "tensorboard" in out.stdout


@pytest.mark.parametrize("options, words", [
    (["--min-replicas", "3", "--max-replicas", "2"],
     "--min-replicas (3) must be <= --max-replicas (2): lower --min-replicas or raise"),
    (["--min-replicas", "0"], "--min-replicas must be an integer >= 1, got 0"),
    (["--cpus-per-replica", "0"], "pass --cpus-per-replica > 0 or --gpus-per-replica > 0"),
    (["--gpus-per-replica", "-1"], "--gpus-per-replica must be a finite number >= 0, got -1"),
    (["--stop-timeout", "0"], "--stop-timeout 0: must be > 0"),
    (["--checkpoint-interval", "-1"], "--checkpoint-interval -1: must be a number of seconds"),
])
def test_bad_replica_bounds_are_one_line_errors(options, words, script, capsys, fake):
    status, _, err = run(capsys, "submit", "--name", "j", *options, str(script))
    assert status == 1
    assert words in one_line_error(err)
    assert not fake.submitted


def test_bad_name_and_missing_script(tmp_path, script, capsys, fake):
    status, _, err = run(capsys, "submit", "--name", "a b", str(script))
    assert status == 1 and "job name 'a b' is not valid" in one_line_error(err)
    status, _, err = run(capsys, "submit", "--name", "j", str(tmp_path / "missing.py"))
    assert status == 1 and "not found" in one_line_error(err)
    other = tmp_path / "elsewhere"
    other.mkdir()
    status, _, err = run(capsys, "submit", "--name", "j", "--working-dir", str(other),
                         str(script))
    assert status == 1 and "outside --working-dir" in one_line_error(err)


def test_submit_passes_the_script_its_own_arguments(script, capsys, fake):
    status, out, _ = run(capsys, "submit", "--name", "j", "--max-replicas", "4", str(script),
                         "--epochs", "3", "--name", "not-ours")
    assert status == 0 and "submitted job j" in out
    (job,) = fake.submitted
    assert job["submission_id"] == "adaptdl-j-1"
    assert job["metadata"]["adaptdl_name"] == "j"
    assert job["runtime_env"]["working_dir"] == str(script.parent)
    assert int(job["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) > 120
    assert job["entrypoint"].endswith("train.py --epochs 3 --name not-ours")
    assert "-m adaptdl_ray.cluster.elastic_job --name j " in job["entrypoint"]
    assert "--max-replicas 4" in job["entrypoint"]


def test_a_running_name_is_refused_and_a_stopped_one_resumes(script, capsys, fake):
    fake.jobs.append(FakeJob("j", "adaptdl-j-1", "RUNNING", 1))
    status, _, err = run(capsys, "submit", "--name", "j", str(script))
    assert status == 1
    line = one_line_error(err)
    assert "job j is already running" in line and "adaptdl-ray stop j" in line
    fake.jobs[0].status = "STOPPED"
    status, out, _ = run(capsys, "submit", "--name", "j", str(script))
    assert status == 0 and "resumes" in out
    assert fake.submitted[-1]["submission_id"] == "adaptdl-j-2"


@pytest.mark.parametrize("verb", [["logs", "nope"], ["stop", "nope"], ["cp", "nope", "dest"]])
def test_unknown_job(verb, capsys, fake):
    status, _, err = run(capsys, *verb)
    assert status == 1
    line = one_line_error(err)
    assert "no job named 'nope'" in line and "adaptdl-ray ls" in line


def test_no_cluster_at_the_address(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, _, err = run(capsys, "ls", "--address", f"http://127.0.0.1:{port}")
    assert status == 1
    line = one_line_error(err)
    assert f"no Ray cluster at http://127.0.0.1:{port}" in line and "ray start --head" in line


def test_ls_merges_ray_status_and_the_jobs_record(tmp_path, capsys, fake):
    fake.jobs += [FakeJob("a", "adaptdl-a-1", "STOPPED", 1000, str(tmp_path)),
                  FakeJob("a", "adaptdl-a-2", "RUNNING", 2000, str(tmp_path)),
                  FakeJob("b", "adaptdl-b-1", "FAILED", 1000, str(tmp_path))]
    JobFiles("a", tmp_path).write_status({"status": "resizing", "replicas": 2, "target": 3,
                                          "nodes": 1, "batch_size": 64, "goodput": 123.456,
                                          "restarts": 4, "submitted": 1.0})
    status, out, _ = run(capsys, "ls", "--json")
    assert status == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["a"]["status"] == "resizing" and rows["a"]["replicas"] == 2
    assert rows["a"]["submission_id"] == "adaptdl-a-2" and rows["a"]["restarts"] == 4
    assert rows["b"]["status"] == "failed" and rows["b"]["replicas"] == 0
    status, out, _ = run(capsys, "ls")
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "STATUS", "REPLICAS", "NODES", "BATCH", "GOODPUT",
                              "RESTARTS", "AGE", "EXPERIMENT", "OWNER", "REASON"]
    assert lines[0].split()[:7] == ["a", "resizing", "2", "1", "64", "123.5", "4"]
    assert lines[0].split()[-2:] == [current_owner(), "-"]


def test_ls_shows_the_allocators_trials(capsys, fake, monkeypatch):
    trial = {"name": "trial_1", "experiment": "sweep", "status": "running", "replicas": 3,
             "target": 3, "nodes": 1, "batch_size": 128, "goodput": 9.0, "restarts": 1,
             "age_s": 75.0}
    monkeypatch.setattr(listing, "allocator_rows", lambda cluster: [trial])
    status, out, _ = run(capsys, "ls")
    assert status == 0
    assert out.splitlines()[1].split() == ["trial_1", "running", "3", "1", "128", "9.0", "1",
                                           "1m15s", "sweep", "-", "-"]


def test_logs_and_stop(tmp_path, capsys, fake):
    fake.jobs += [FakeJob("j", "adaptdl-j-1", "STOPPED", 1, str(tmp_path)),
                  FakeJob("j", "adaptdl-j-2", "RUNNING", 2, str(tmp_path))]
    status, out, _ = run(capsys, "logs", "j")
    assert status == 0 and out == "logs of adaptdl-j-2\n"
    status, out, _ = run(capsys, "logs", "--all", "j")
    assert "logs of adaptdl-j-1" in out and "logs of adaptdl-j-2" in out
    status, out, _ = run(capsys, "logs", "-f", "j")
    assert status == 0 and out == "first of adaptdl-j-2\nsecond\n"
    status, out, _ = run(capsys, "stop", "j")
    assert status == 0 and fake.stopped == ["adaptdl-j-2"]
    status, _, err = run(capsys, "stop", "j")
    assert status == 1 and "is not running" in one_line_error(err)


def test_cp_copies_the_newest_checkpoint(tmp_path, capsys):
    files = JobFiles("j", tmp_path / "store")
    for seq in (0, 1):
        _write_checkpoint(files.checkpoint_path / f"checkpoint-{seq}", seq)
    status, out, _ = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                         str(tmp_path / "out"))
    assert status == 0 and f"to {tmp_path / 'out'}\n" in out
    assert f"model_state_dict({str(tmp_path / 'out')!r})" in out
    assert json.loads((tmp_path / "out" / "s").read_text()) == 1
    # An existing directory receives the checkpoint under its own name, once.
    status, out, _ = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                         str(tmp_path / "out"))
    assert status == 0 and f"to {tmp_path / 'out' / 'checkpoint-1'}\n" in out
    status, _, err = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                         str(tmp_path / "out"))
    assert status == 1 and "exists already" in one_line_error(err)
    status, _, err = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "other",
                         str(tmp_path / "x"))
    assert status == 1 and "no job named 'other' under --storage-path" in one_line_error(err)


def test_tensorboard_missing_is_a_clear_error(capsys, monkeypatch):
    real = job_verbs.importlib.util.find_spec
    monkeypatch.setattr(job_verbs.importlib.util, "find_spec",
                        lambda name: None if name == "tensorboard" else real(name))
    status, _, err = run(capsys, "tensorboard", "j")
    assert status == 1 and "pip install tensorboard" in one_line_error(err)


def test_every_kind_of_address_is_understood():
    assert cli_cluster.Cluster("http://head:8265").kind == "dashboard"
    assert cli_cluster.Cluster("head:6379").kind == "gcs"
    assert cli_cluster.Cluster("ray://head:10001").kind == "client"
    assert cli_cluster.Cluster("auto").kind == "auto"
    assert cli_cluster.Cluster(None).kind == "search"
    with pytest.raises(cli.CliError, match="use the dashboard URL"):
        cli_cluster.Cluster("ftp://head:1")
    # Joining as a driver: a GCS or client address as given, auto as auto.
    for address in ("head:6379", "ray://head:10001", "auto"):
        assert cli_cluster.Cluster(address).driver_address() == address


class ProbeClient:
    """A Job Submission client whose jobs print what the probe asks for."""

    def __init__(self, gcs):
        self.gcs, self.submitted, self.deleted = gcs, [], []

    def submit_job(self, entrypoint, submission_id, metadata):
        assert "RAY_ADDRESS" in entrypoint and metadata.get("adaptdl_probe")
        self.submitted.append(submission_id)

    def get_job_status(self, sid):
        return types.SimpleNamespace(is_terminal=lambda: True)

    def get_job_logs(self, sid):
        return (f"Running entrypoint for job {sid}: python -c \"print('ADAPTDL_GCS_ADDRESS=' + "
                f"...)\"\nADAPTDL_GCS_ADDRESS={self.gcs}\n")

    def delete_job(self, sid):
        self.deleted.append(sid)


def test_a_dashboards_gcs_address_is_asked_of_its_cluster_once_per_session(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    client = ProbeClient("10.0.0.7:6390")
    url = "http://127.0.0.1:8390"
    assert gcs_address.gcs_address(url, client, "session_a") == "10.0.0.7:6390"
    assert client.submitted == client.deleted and len(client.submitted) == 1
    # The same session again: from the cache, no job.
    assert gcs_address.gcs_address(url, client, "session_a") == "10.0.0.7:6390"
    assert len(client.submitted) == 1
    # The cluster restarted (a new session, maybe another port): asked again.
    client.gcs = "10.0.0.7:7000"
    assert gcs_address.gcs_address(url, client, "session_b") == "10.0.0.7:7000"
    assert len(client.submitted) == 2
    silent = ProbeClient("")
    with pytest.raises(cli.CliError, match="did not tell its GCS address.*--address"):
        gcs_address.gcs_address("http://other:1", silent, "s")


def test_an_address_from_the_environment_is_named_in_errors(capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    status, _, err = run(capsys, "ls")
    assert status == 1
    line = one_line_error(err)
    assert f"no Ray cluster at 127.0.0.1:{port} (from RAY_ADDRESS)" in line


def test_another_persons_job_is_not_stopped_or_copied_without_force(tmp_path, capsys, fake):
    fake.jobs.append(FakeJob("theirs", "adaptdl-theirs-1", "RUNNING", 1, str(tmp_path),
                             owner="ada@elsewhere"))
    for verb in (["stop", "theirs"], ["cp", "theirs", str(tmp_path / "out")]):
        status, _, err = run(capsys, *verb)
        assert status == 1
        line = one_line_error(err)
        assert "job theirs is ada@elsewhere's" in line and "--force theirs" in line
    assert fake.stopped == []
    status, out, _ = run(capsys, "stop", "--force", "theirs")
    assert status == 0 and fake.stopped == ["adaptdl-theirs-1"]


def test_a_script_that_does_not_parse_is_refused_before_submitting(tmp_path, capsys, fake):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\ndef f(:\n    pass\n")
    status, _, err = run(capsys, "submit", "--name", "j", str(bad))
    assert status == 1
    line = one_line_error(err)
    assert f"{bad}:2:" in line and "does not parse" in line
    assert not fake.submitted


def test_cp_to_a_place_that_cannot_hold_it_is_one_line(tmp_path, capsys):
    files = JobFiles("j", tmp_path / "store")
    _write_checkpoint(files.checkpoint_path / "checkpoint-0", 0)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for dest, words in ((a_file, "is a file"), (tmp_path / "no" / "such" / "dir",
                                                  "does not exist: create it first")):
        status, _, err = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                             str(dest))
        assert status == 1 and words in one_line_error(err)


def test_logs_drop_colour_codes_when_not_on_a_terminal(tmp_path, capsys, fake):
    fake.jobs.append(FakeJob("j", "adaptdl-j-1", "SUCCEEDED", 1, str(tmp_path)))
    fake.get_job_logs = lambda sid: "\x1b[36m(ReplicaWorker pid=1)\x1b[0m epoch 0\n"
    status, out, _ = run(capsys, "logs", "j")
    assert status == 0 and out == "(ReplicaWorker pid=1) epoch 0\n"


def _write_checkpoint(path: Path, value: int) -> None:
    """A tiny intact checkpoint holding one JSON state ``s``."""
    import zlib
    path.mkdir(parents=True)
    data = json.dumps(value).encode()
    (path / "s").write_bytes(data)
    (path / "MANIFEST.json").write_text(json.dumps({
        "format": 2, "states": ["s"], "num_restarts": value,
        "files": {"s": {"size": len(data), "crc32": zlib.crc32(data)}}}))


def test_status_reads_as_a_summary():
    from adaptdl_ray.cli.allocator_verbs import status_lines
    lines = status_lines({"members": 2, "jobs": 3, "solves": 7, "last_solve_s": 0.004,
                          "nodes": {"a": {"CPU": 4.0}, "b": {"CPU": 2.0, "GPU": 1.0}},
                          "started": 0.0, "pid": 42, "policy": "adaptdl",
                          "state_dir": "/tmp/s", "autoscale": None})
    assert "policy adaptdl" in lines[0] and "pid 42" in lines[0]
    assert lines[1] == "divides: 6 CPU, 1 GPU on 2 node(s), less what other work holds"
    assert "2 (sweeps and jobs), 3 job(s)" in lines[2] and "4 ms" in lines[2]
    assert lines[3].startswith("autoscaling: off") and lines[4] == "state kept in /tmp/s"


def test_a_dashboard_that_fails_a_request_is_one_line(capsys, fake):
    def broken():
        raise RuntimeError("Request failed with status code 500: 500 Internal Server Error\n"
                           "\nServer got itself in trouble.")
    fake.list_jobs = broken
    status, _, err = run(capsys, "ls")
    assert status == 1
    line = one_line_error(err)
    assert "Job Submission API failed: Request failed with status code 500" in line


def test_a_reader_that_goes_away_ends_the_verb_quietly(monkeypatch, capsys):
    """`adaptdl-ray ls | head -2`: the pipe closes under the verb; no error line blames the
    cluster, and the status is a broken pipe's (128 + SIGPIPE)."""
    import argparse
    import importlib
    import os

    cli_main = importlib.import_module("adaptdl_ray.cli.main")

    def closed_pipe(opts):
        raise BrokenPipeError(32, "Broken pipe")

    parser = argparse.ArgumentParser()
    parser.set_defaults(fn=closed_pipe)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    saved = os.dup(1)
    try:
        assert cli_main.main([]) == 141
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert "error" not in capsys.readouterr().err
