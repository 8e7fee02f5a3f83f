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
from adaptdl_ray.cluster.job_files import JobFiles

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
    def __init__(self, name, sid, status, start, storage=""):
        self.submission_id = sid
        self.status = status
        self.start_time = start
        self.metadata = {"adaptdl_name": name, "adaptdl_storage_path": storage}


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
    monkeypatch.setattr(cli, "_client", lambda opts: client)
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
    (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas 2 is below --min-replicas 3"),
    (["--min-replicas", "0"], "--min-replicas 0: must be >= 1"),
    (["--cpus-per-replica", "0"], "both 0"),
    (["--gpus-per-replica", "-1"], "--gpus-per-replica -1: must be a number >= 0"),
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


def test_ls_merges_ray_status_and_the_jobs_record(tmp_path, capsys, fake, monkeypatch):
    monkeypatch.setattr(cli, "_allocator_client", lambda: None)
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
                              "RESTARTS", "AGE", "EXPERIMENT"]
    assert lines[0].split()[:7] == ["a", "resizing", "2", "1", "64", "123.5", "4"]


def test_ls_shows_the_allocators_trials(capsys, fake, monkeypatch):
    trial = {"name": "trial_1", "experiment": "sweep", "status": "running", "replicas": 3,
             "target": 3, "nodes": 1, "batch_size": 128, "goodput": 9.0, "restarts": 1,
             "age_s": 75.0}
    monkeypatch.setattr(cli, "_allocator_jobs", lambda opts: [trial])
    status, out, _ = run(capsys, "ls")
    assert status == 0
    assert out.splitlines()[1].split() == ["trial_1", "running", "3", "1", "128", "9.0", "1",
                                           "1m15s", "sweep"]


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
    assert status == 0 and out.strip() == str(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "s").read_text()) == 1
    # An existing directory receives the checkpoint under its own name, once.
    status, out, _ = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                         str(tmp_path / "out"))
    assert status == 0 and out.strip() == str(tmp_path / "out" / "checkpoint-1")
    status, _, err = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "j",
                         str(tmp_path / "out"))
    assert status == 1 and "exists already" in one_line_error(err)
    status, _, err = run(capsys, "cp", "--storage-path", str(tmp_path / "store"), "other",
                         str(tmp_path / "x"))
    assert status == 1 and "no job named 'other' under --storage-path" in one_line_error(err)


def test_tensorboard_missing_is_a_clear_error(capsys, monkeypatch):
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: None if name == "tensorboard" else real(name))
    status, _, err = run(capsys, "tensorboard", "j")
    assert status == 1 and "pip install tensorboard" in one_line_error(err)


def test_driver_address_follows_the_dashboard_address():
    def address(value):
        return cli._driver_address(types.SimpleNamespace(address=value))
    assert address("http://127.0.0.1:8265") == "auto"
    assert address("http://head.example:8265") == "ray://head.example:10001"
    assert address("ray://head:10001") == "ray://head:10001"
    assert address("10.0.0.1:6379") == "10.0.0.1:6379"


def _write_checkpoint(path: Path, value: int) -> None:
    """A tiny intact checkpoint holding one JSON state ``s``."""
    import zlib
    path.mkdir(parents=True)
    data = json.dumps(value).encode()
    (path / "s").write_bytes(data)
    (path / "MANIFEST.json").write_text(json.dumps({
        "format": 2, "states": ["s"], "num_restarts": value,
        "files": {"s": {"size": len(data), "crc32": zlib.crc32(data)}}}))
