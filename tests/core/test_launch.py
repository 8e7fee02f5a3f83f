"""The standalone launcher: `python -m adaptdl_core.launch` and its functions."""

import subprocess
import sys

import pytest

from adaptdl_core import checkpoint, launch
from tests.core.harness import JOBS, read_events


@pytest.mark.slow
def test_cli_stops_with_143_resumes_on_fewer_replicas_then_finds_the_job_finished(tmp_path):
    """The same command three times: Ctrl-C-like stop (143); resume on one replica, the
    restart count taken from the checkpoint, to the end (0), leaving the end of training
    as the newest checkpoint; run again: nothing trained, exit 0."""
    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "adaptdl_core.launch", *args],
                             capture_output=True, text=True, timeout=180)
        return out.returncode, out.stdout + out.stderr

    ckpt = tmp_path / "ckpt"
    job = [str(JOBS / "elastic_job.py"), "--record", str(tmp_path), "--size", "48"]
    status, out = cli("--replicas", "2", "--checkpoint-path", str(ckpt), *job,
                      "--stop-after", "3")
    assert status == 143, out
    interrupted = launch.resume_point(ckpt)
    assert (interrupted.restarts, interrupted.finished) == (0, False)
    # Each checkpoint's path is logged once (by replica 0's save), and the launcher's
    # last line says where the newest one is (also for a script without logging set up).
    assert out.count(f"to {interrupted.path}") == 1, out
    assert out.rstrip().endswith(f"job stopped at a checkpoint; newest checkpoint "
                                 f"{interrupted.path} (0 epochs finished); the same "
                                 f"command resumes it"), out

    status, out = cli("--replicas", "1", "--checkpoint-path", str(ckpt), *job)
    assert status == 0, out
    assert f"resuming from {interrupted.path} (0 epochs finished): restart 1" in out, out
    final = launch.resume_point(ckpt)
    assert (final.restarts, final.finished, final.finished_epochs) == (1, True, 3)
    assert out.count(f"to {final.path}") == 1, out
    assert out.rstrip().endswith(f"job finished; newest checkpoint {final.path} (the end "
                                 f"of training (3 epochs))"), out

    status, out = cli("--replicas", "2", "--checkpoint-path", str(ckpt), *job)
    assert status == 0, out
    assert f"{final.path} is the end of training (3 epochs)" in out, out
    assert "job already finished (3 epochs); nothing to do" in out, out
    assert launch.resume_point(ckpt).path == final.path  # nothing saved again

    events = read_events(tmp_path)
    assert {(e["restart"], e["rank"]) for e in events} == \
        {(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)}
    assert not [e for e in events if e["event"] == "batch" and e["restart"] == 2]
    for epoch in range(3):
        seen = sorted(i for e in events if e["event"] == "batch" and e["epoch"] == epoch
                      for i in e["idx"])
        assert seen == list(range(48))


def test_the_restart_count_comes_from_the_checkpoint_unless_given(tmp_path, monkeypatch,
                                                                  caplog):
    assert launch.resume_point(None) is None
    assert launch.resume_point(tmp_path / "none") is None
    assert launch.restarts_for(None, None) == 0 and launch.restarts_for(4, None) == 4
    monkeypatch.setenv("ADAPTDL_NUM_RESTARTS", "2")
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(tmp_path))
    _Counter("restarts-test").value = 5
    saved = checkpoint.save_all_states()
    point = launch.resume_point(tmp_path)
    assert point == launch.ResumePoint(saved, 2, None, False)
    with caplog.at_level("INFO", logger="adaptdl_core.launch"):
        assert launch.restarts_for(None, point) == 3
        assert launch.restarts_for(7, point) == 7
        assert launch.restarts_for(1, point) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert f"resuming from {saved} (a checkpoint): restart 3" in lines
    assert any(r.levelname == "WARNING" and "--restarts 1 is below the 3 restarts" in
               r.getMessage() for r in caplog.records), lines


def test_the_last_line_says_how_the_job_ended_and_where_its_checkpoint_is():
    point = launch.ResumePoint("/c/checkpoint-3", 2, 4, False)
    assert launch.end_line(1, "/c", point) == \
        "job failed (status 1); newest checkpoint /c/checkpoint-3 (4 epochs finished); " \
        "the same command resumes it"
    assert launch.end_line(0, None, None) == "job finished; no --checkpoint-path, nothing saved"
    assert launch.end_line(143, "/c", None) == \
        "job stopped at a checkpoint; no checkpoint under /c"


def test_cli_refuses_a_negative_count_and_a_damaged_checkpoint_path(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--restarts", "-1", "train.py"])
    assert exit_info.value.code == 2
    assert "--restarts -1: must be >= 0" in capsys.readouterr().err
    damaged = tmp_path / "checkpoint-0"
    damaged.mkdir()
    (damaged / "MANIFEST.json").write_text("{")
    with pytest.raises(SystemExit):
        launch.main(["--checkpoint-path", str(tmp_path), "train.py"])
    err = capsys.readouterr().err
    assert f"--checkpoint-path {tmp_path}: no intact checkpoint" in err
    assert str(damaged / "MANIFEST.json") in err


class _Counter(checkpoint.State):
    def __init__(self, name):
        super().__init__(name)
        self.value = 0

    def save(self, fileobj):
        checkpoint.dump_json(self.value, fileobj)

    def load(self, fileobj):
        self.value = checkpoint.load_json(fileobj)


def test_job_status_and_env():
    assert launch.job_status([0, 0]) == 0
    assert launch.job_status([143, 143]) == 143
    assert launch.job_status([143, 0]) == 143
    assert launch.job_status([143, 7, 1]) == 7
    env = launch.replica_env(1, 3, 4321, checkpoint_path="/x", num_restarts=2, base_env={})
    assert env == {"ADAPTDL_MASTER_ADDR": "127.0.0.1", "ADAPTDL_MASTER_PORT": "4321",
                   "ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_NUM_REPLICAS": "3",
                   "ADAPTDL_NUM_RESTARTS": "2", "ADAPTDL_CHECKPOINT_PATH": "/x"}
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\], got 3"):
        launch.replica_env(3, 3, 1)
    with pytest.raises(ValueError, match="num_replicas"):
        launch.start_replicas([sys.executable, "-c", "pass"], 0)
