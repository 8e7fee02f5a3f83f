"""adaptdl_core.checkpoint: named States, atomic checkpoints, restore after a restart.

A "restart" inside one process is simulated with ``context.reset()`` (the
``restart`` fixture), which forgets every State and the restore point, so States created
next reload from the newest checkpoint. Crashes are simulated with leftover temporary
directories, with States whose save() fails, and with a real child process killed by
SIGKILL while it writes a checkpoint. The last test runs the whole torch API in a child
process and checks that every file it writes is JSON or loads under
``torch.load(weights_only=True)``.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from adaptdl_core import checkpoint, context

HERE = Path(__file__).parent
REPO = HERE.parent.parent


class JsonState(checkpoint.State):
    """A State holding any JSON value; counts its calls."""

    def __init__(self, name, value=None):
        super().__init__(name)
        self.value = value
        self.saves = self.loads = self.syncs = 0

    def save(self, fileobj):
        self.saves += 1
        checkpoint.dump_json(self.value, fileobj)

    def load(self, fileobj):
        self.loads += 1
        self.value = checkpoint.load_json(fileobj)

    def sync(self):
        self.syncs += 1


class FailingState(checkpoint.State):
    """Writes part of its data, then raises."""

    def __init__(self, name, exc=OSError("disk on fire")):
        super().__init__(name)
        self.exc = exc

    def save(self, fileobj):
        fileobj.write(b"partial data")
        raise self.exc

    def load(self, fileobj):
        raise AssertionError("a FailingState is never saved, so never loaded")


def listing(root):
    return sorted(os.listdir(root))


def ckpt_names(root):
    return sorted(e for e in os.listdir(root) if e.startswith("checkpoint-"))


# -- round trip ----------------------------------------------------------------------------

def test_round_trip_through_save_all_states_and_load_state(ckpt_dir, restart):
    a = JsonState("model", {"w": [1.0, 2.0]})
    b = JsonState("loader-0", {"index": 17})
    assert checkpoint.load_state(a) is False  # first run: nothing to restore
    final = checkpoint.save_all_states()
    assert final == str(ckpt_dir / "checkpoint-0")
    assert a.syncs == b.syncs == 1 and a.saves == b.saves == 1
    assert listing(final) == ["MANIFEST.json", "loader-0", "model"]
    assert json.loads((ckpt_dir / "checkpoint-0" / "model").read_text()) == {"w": [1.0, 2.0]}

    restart()
    a2 = JsonState("model")
    b2 = JsonState("loader-0")
    assert checkpoint.load_state(a2) is True
    assert checkpoint.load_state(b2) is True
    assert a2.value == {"w": [1.0, 2.0]} and b2.value == {"index": 17}
    # A state that did not exist when the checkpoint was taken is not found.
    c2 = JsonState("new-state", "fresh")
    assert checkpoint.load_state(c2) is False
    assert c2.value == "fresh" and c2.loads == 0


def test_manifest_lists_states_in_registration_order(ckpt_dir, monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_RESTARTS", "3")
    for name in ["zeta", "alpha", "mid.dle", "x-y_z"]:
        JsonState(name, name)
    before = time.time()
    final = checkpoint.save_all_states()
    manifest = json.loads(Path(final, "MANIFEST.json").read_text())
    assert manifest["states"] == ["zeta", "alpha", "mid.dle", "x-y_z"]
    assert manifest["num_restarts"] == 3
    assert manifest["num_replicas"] == 1
    assert before - 1 <= manifest["time"] <= time.time() + 1


def test_sync_runs_in_registration_order_before_any_write(ckpt_dir):
    events = []

    class Probe(JsonState):
        def sync(self):
            events.append(("sync", self.name, os.listdir(ckpt_dir)))

        def save(self, fileobj):
            events.append(("save", self.name))
            super().save(fileobj)

    Probe("p1", 1)
    Probe("p2", 2)
    checkpoint.save_all_states()
    assert events == [("sync", "p1", []), ("sync", "p2", []), ("save", "p1"), ("save", "p2")]


def test_restart_reads_the_newest_checkpoint(ckpt_dir, restart):
    s = JsonState("counter", 0)
    for value in range(1, 4):
        s.value = value
        checkpoint.save_all_states()
    assert ckpt_names(ckpt_dir) == ["checkpoint-1", "checkpoint-2"]  # newest + fallback
    restart()
    s = JsonState("counter")
    assert checkpoint.load_state(s) and s.value == 3


def test_restore_point_follows_this_runs_checkpoints(ckpt_dir, restart):
    s = JsonState("s", "old")
    checkpoint.save_all_states()
    restart()
    s = JsonState("s")
    assert checkpoint.load_state(s) and s.value == "old"
    s.value = "new"
    checkpoint.save_all_states()
    assert checkpoint.latest_checkpoint_dir() == str(ckpt_dir / "checkpoint-1")
    # Loads in this run read the newest checkpoint, which holds what this run saved...
    s.value = "in memory"
    assert checkpoint.load_state(s) and s.value == "new"
    # After a restart the newest one is.
    restart()
    s = JsonState("s")
    assert checkpoint.load_state(s) and s.value == "new"


def _intact_checkpoint(path):
    path.mkdir()
    (path / "MANIFEST.json").write_text(json.dumps({"states": [], "files": {}}))


def test_latest_checkpoint_dir_orders_numerically(tmp_path):
    for seq in (2, 9, 10):
        _intact_checkpoint(tmp_path / f"checkpoint-{seq}")
    assert checkpoint.latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert checkpoint.latest_checkpoint_dir(tmp_path) == str(tmp_path / "checkpoint-10")
    assert checkpoint.latest_checkpoint_dir(str(tmp_path / "missing")) is None
    assert checkpoint.latest_checkpoint_dir() is None  # no ADAPTDL_CHECKPOINT_PATH


def test_next_sequence_number_follows_the_largest(ckpt_dir):
    _intact_checkpoint(ckpt_dir / "checkpoint-9")
    _intact_checkpoint(ckpt_dir / "checkpoint-10")
    JsonState("s", 1)
    assert checkpoint.save_all_states() == str(ckpt_dir / "checkpoint-11")
    assert ckpt_names(ckpt_dir) == ["checkpoint-10", "checkpoint-11"]


def test_only_complete_checkpoint_directories_are_read(ckpt_dir, restart):
    s = JsonState("s", "good")
    checkpoint.save_all_states()
    restart()
    # Things that look like newer checkpoints but are not complete checkpoint directories.
    for junk in [".tmp-abc123", "checkpoint-7.tmp", "checkpoint-x", "checkpoint-",
                 "checkpoint-8-old"]:
        (ckpt_dir / junk).mkdir()
        (ckpt_dir / junk / "s").write_text(json.dumps("junk"))
    (ckpt_dir / "checkpoint-9").write_text("a file, not a directory")
    assert checkpoint.latest_checkpoint_dir() == str(ckpt_dir / "checkpoint-0")
    s = JsonState("s")
    assert checkpoint.load_state(s) and s.value == "good"


def test_load_state_without_checkpoint_path_returns_false(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = JsonState("s", "v")
    assert checkpoint.load_state(s) is False
    assert s.value == "v" and s.loads == 0


# -- names ---------------------------------------------------------------------------------

def test_duplicate_names_raise(ckpt_dir):
    first = JsonState("model")
    with pytest.raises(ValueError, match="'model'"):
        JsonState("model")
    # The failed construction did not replace the registered State.
    assert context.current().states.get("model") is first


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".", "..", "sp ace", "tab\t", "ünï",
                                  "a\\b", "\nx", "x\ny", None, 5, b"bytes"])
def test_invalid_names_raise(name):
    with pytest.raises(ValueError, match="State name"):
        JsonState(name)
    assert checkpoint.state_names() == []


def test_name_with_trailing_newline_is_rejected():
    with pytest.raises(ValueError, match="State name"):
        JsonState("model\n")


@pytest.mark.parametrize("name", ["a", "A.b-c_d", "adaptdl-dataloader-0", "..x", "0"])
def test_valid_names(name):
    assert JsonState(name).name == name


def test_names_are_free_again_after_unregister_all(restart):
    JsonState("again")
    restart()
    JsonState("again")


def test_base_state_methods_are_abstract(ckpt_dir):
    checkpoint.State("plain")
    with pytest.raises(NotImplementedError):
        checkpoint.save_all_states()
    assert listing(ckpt_dir) == []


def test_state_named_like_the_manifest_is_rejected():
    # Its file would overwrite the checkpoint's manifest.
    with pytest.raises(ValueError, match="'MANIFEST.json' is reserved for the checkpoint "
                                         "manifest"):
        JsonState("MANIFEST.json", {"mine": 1})
    assert checkpoint.state_names() == []


# -- save_state ----------------------------------------------------------------------------

def test_save_state_keeps_other_states_of_the_previous_checkpoint(ckpt_dir, restart):
    a = JsonState("a", "a0")
    b = JsonState("b", "b0")
    c = JsonState("c", "c0")
    checkpoint.save_all_states()
    a.value, b.value, c.value = "a1", "b1", "c1"
    b.syncs = 0
    final = checkpoint.save_state(b)
    assert final == str(ckpt_dir / "checkpoint-1")
    assert ckpt_names(ckpt_dir) == ["checkpoint-0", "checkpoint-1"]
    assert b.syncs == 1 and a.syncs == 1  # only b was synced (a: once, by save_all_states)
    manifest = json.loads(Path(final, "MANIFEST.json").read_text())
    assert sorted(manifest["states"]) == ["a", "b", "c"]
    assert manifest["states"][0] == "b"

    restart()
    a, b, c = JsonState("a"), JsonState("b"), JsonState("c")
    for s in (a, b, c):
        assert checkpoint.load_state(s)
    assert (a.value, b.value, c.value) == ("a0", "b1", "c0")


def test_save_state_without_previous_checkpoint(ckpt_dir, restart):
    JsonState("other", "o")
    s = JsonState("only", 1)
    final = checkpoint.save_state(s, sync=False)
    assert s.syncs == 0
    assert listing(final) == ["MANIFEST.json", "only"]
    restart()
    s2, other = JsonState("only"), JsonState("other")
    assert checkpoint.load_state(s2) and s2.value == 1
    assert checkpoint.load_state(other) is False


def test_save_state_of_unregistered_state_raises(ckpt_dir, restart):
    s = JsonState("s", 1)
    restart()
    with pytest.raises(ValueError, match="not a registered State"):
        checkpoint.save_state(s)  # forgotten by the restart
    JsonState("s", 2)
    with pytest.raises(ValueError, match="not a registered State"):
        checkpoint.save_state(s)  # another object now owns the name
    with pytest.raises(ValueError, match="not a registered State"):
        checkpoint.save_state("s")
    assert listing(ckpt_dir) == []


def test_state_created_after_a_save_in_the_restarted_run_is_still_restored(ckpt_dir, restart):
    x, y = JsonState("x", 1), JsonState("y", "y-data")
    checkpoint.save_all_states()
    restart()
    x = JsonState("x")
    assert checkpoint.load_state(x) and x.value == 1
    x.value = 2
    checkpoint.save_state(x)  # keeps y (hard link) in the new checkpoint
    y = JsonState("y")  # e.g. an Accumulator or loader created later in the program
    assert checkpoint.load_state(y)
    assert y.value == "y-data"


def test_save_all_states_in_a_restarted_run_keeps_states_not_created_yet(ckpt_dir, restart):
    JsonState("x", 1), JsonState("late", "late-data")
    checkpoint.save_all_states()
    restart()
    x = JsonState("x")
    assert checkpoint.load_state(x)
    x.value = 2
    checkpoint.save_all_states()  # "late" is not registered in this run yet
    late = JsonState("late")
    assert checkpoint.load_state(late) and late.value == "late-data"
    restart()  # and it survives one more restart
    x, late = JsonState("x"), JsonState("late")
    assert checkpoint.load_state(x) and x.value == 2
    assert checkpoint.load_state(late) and late.value == "late-data"


def test_other_replicas_restore_states_created_after_a_save(ckpt_dir, restart, monkeypatch):
    import shutil

    JsonState("x", 1), JsonState("late", "late-data")
    checkpoint.save_all_states()
    restart()
    # This process now plays replica 1 of 2 after a restart from checkpoint-0.
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "1")
    x = JsonState("x")
    assert checkpoint.load_state(x)
    assert checkpoint.save_all_states() is None  # replica 1 writes nothing ...
    # ... while replica 0 commits checkpoint-1 (carrying "late" over) and removes checkpoint-0.
    shutil.copytree(ckpt_dir / "checkpoint-0", ckpt_dir / "checkpoint-1")
    shutil.rmtree(ckpt_dir / "checkpoint-0")
    late = JsonState("late")  # created after the save, as on replica 0
    assert checkpoint.load_state(late) and late.value == "late-data"


# -- no checkpoint path, other ranks -------------------------------------------------------

def test_no_checkpoint_path_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = JsonState("s", 1)
    assert checkpoint.save_all_states() is None
    assert s.syncs == 1 and s.saves == 0  # sync is a collective: it still runs
    assert checkpoint.save_state(s) is None
    assert s.saves == 0
    assert listing(tmp_path) == []


def test_only_replica_zero_writes(ckpt_dir, monkeypatch):
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "1")
    s = JsonState("s", 1)
    assert checkpoint.save_all_states() is None
    assert checkpoint.save_state(s) is None
    assert s.syncs == 2 and s.saves == 0
    assert listing(ckpt_dir) == []


def test_checkpoint_path_is_created_when_missing(tmp_path, monkeypatch):
    root = tmp_path / "not" / "yet"
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(root))
    JsonState("s", 1)
    assert checkpoint.save_all_states() == str(root / "checkpoint-0")


# -- atomicity -----------------------------------------------------------------------------

@pytest.mark.parametrize("exc", [OSError("disk on fire"), KeyboardInterrupt()])
def test_failing_save_leaves_previous_checkpoint_latest(ckpt_dir, restart, exc):
    good = JsonState("good", "v0")
    checkpoint.save_all_states()
    good.value = "v1"
    bad = FailingState("bad", exc)
    with pytest.raises(type(exc)):
        checkpoint.save_all_states()
    assert listing(ckpt_dir) == ["checkpoint-0"]  # no temporary directory left either
    assert listing(ckpt_dir / "checkpoint-0") == ["MANIFEST.json", "good"]
    with pytest.raises(type(exc)):
        checkpoint.save_state(bad)
    assert listing(ckpt_dir) == ["checkpoint-0"]

    restart()
    good = JsonState("good")
    assert checkpoint.load_state(good) and good.value == "v0"


def test_failing_first_save_leaves_nothing(ckpt_dir):
    JsonState("a", 1)
    FailingState("b")
    with pytest.raises(OSError):
        checkpoint.save_all_states()
    assert listing(ckpt_dir) == []
    assert checkpoint.latest_checkpoint_dir() is None


def test_leftover_tmp_directory_is_ignored_and_cleaned(ckpt_dir, restart):
    s = JsonState("s", "committed")
    checkpoint.save_all_states()
    # A crash in the middle of the next checkpoint leaves a temporary directory behind.
    crashed = ckpt_dir / ".tmp-crashed"
    crashed.mkdir()
    (crashed / "s").write_text(json.dumps("half-written"))
    restart()
    s = JsonState("s")
    assert checkpoint.load_state(s) and s.value == "committed"
    s.value = "next"
    final = checkpoint.save_all_states()
    assert listing(ckpt_dir) == ["checkpoint-0", "checkpoint-1"]
    assert Path(final) == ckpt_dir / "checkpoint-1"
    restart()
    s = JsonState("s")
    assert checkpoint.load_state(s) and s.value == "next"


def test_leftover_tmp_directory_is_cleaned_by_save_state(ckpt_dir):
    s = JsonState("s", 1)
    (ckpt_dir / ".tmp-old").mkdir()
    checkpoint.save_state(s)
    assert listing(ckpt_dir) == ["checkpoint-0"]


def test_older_checkpoints_are_removed_after_a_new_one(ckpt_dir):
    s = JsonState("s", 0)
    seen = []
    for i in range(4):
        s.value = i
        seen.append(checkpoint.save_all_states())
        # The newest intact older checkpoint stays as a fallback; the rest go.
        assert ckpt_names(ckpt_dir) == [f"checkpoint-{j}" for j in range(max(0, i - 1), i + 1)]
    assert seen == [str(ckpt_dir / f"checkpoint-{i}") for i in range(4)]
    assert json.loads((ckpt_dir / "checkpoint-3" / "s").read_text()) == 3


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from adaptdl_core import checkpoint

    class Blob(checkpoint.State):
        def __init__(self, name, fill, size, slow=False):
            super().__init__(name)
            self.data, self.fill, self.size, self.slow = None, fill, size, slow
        def save(self, f):
            chunk = self.fill * (1 << 16)
            for i in range(self.size >> 16):
                f.write(chunk)
                if self.slow:
                    if i == 4:
                        print("WRITING", flush=True)
                    time.sleep(0.05)
        def load(self, f):
            self.data = f.read()

    a = Blob("a", b"N", 4 << 20)
    b = Blob("b", b"n", 8 << 20, slow=True)
    assert checkpoint.load_state(a) and checkpoint.load_state(b)
    assert a.data == b"O" * (1 << 20) and b.data == b"o" * (1 << 20)
    checkpoint.save_all_states()
    print("FINISHED", flush=True)
""")


class Blob(checkpoint.State):
    def __init__(self, name, data=None):
        super().__init__(name)
        self.data = data

    def save(self, fileobj):
        fileobj.write(self.data)

    def load(self, fileobj):
        self.data = fileobj.read()


def test_sigkill_while_writing_leaves_previous_checkpoint_loadable(ckpt_dir, restart,
                                                                   subprocess_env):
    Blob("a", b"O" * (1 << 20))
    Blob("b", b"o" * (1 << 20))
    checkpoint.save_all_states()
    restart()

    subprocess_env["ADAPTDL_CHECKPOINT_PATH"] = str(ckpt_dir)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER], env=subprocess_env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line == "WRITING\n", (line, proc.stderr.read() if proc.poll() is not None else "")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    entries = listing(ckpt_dir)
    tmps = [e for e in entries if e.startswith(".tmp-")]
    assert ckpt_names(ckpt_dir) == ["checkpoint-0"]
    assert len(tmps) == 1, entries  # the child died in the middle of a checkpoint ...
    assert listing(ckpt_dir / tmps[0]) == ["a"]  # ... after writing "a" in full
    assert (ckpt_dir / tmps[0] / "a").stat().st_size == 4 << 20

    a, b = Blob("a"), Blob("b")
    assert checkpoint.latest_checkpoint_dir() == str(ckpt_dir / "checkpoint-0")
    assert checkpoint.load_state(a) and checkpoint.load_state(b)
    assert a.data == b"O" * (1 << 20) and b.data == b"o" * (1 << 20)
    a.data = b"A"
    checkpoint.save_all_states()
    assert listing(ckpt_dir) == ["checkpoint-0", "checkpoint-1"]


# -- what the library itself writes -------------------------------------------------------

def test_everything_the_library_writes_is_json_or_weights_only_loadable(tmp_path,
                                                                         subprocess_env):
    """A tiny single-process job (AdaptiveDataParallel + AdaptiveDataLoader + Accumulator
    holding numpy and tensor values) checkpoints; every file must be JSON or load with
    torch.load(weights_only=True)."""
    import torch

    ckpt = tmp_path / "ckpt"
    out = tmp_path / "out"
    out.mkdir()
    subprocess_env["ADAPTDL_CHECKPOINT_PATH"] = str(ckpt)
    proc = subprocess.run([sys.executable, str(HERE / "jobs" / "collective_job.py"), "ckpt",
                           "--out", str(out)], env=subprocess_env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "rank0.json").read_text())

    latest = checkpoint.latest_checkpoint_dir(str(ckpt))
    assert latest is not None and Path(latest).name == "checkpoint-0"
    files = listing(latest)
    assert {"MANIFEST.json", "adaptdl-dataparallel", "adaptdl-epoch",
            "adaptdl-dataloader-0"} <= set(files)
    assert any(f.startswith("adaptdl-accumulator-") for f in files)
    manifest = json.loads(Path(latest, "MANIFEST.json").read_text())
    assert sorted(manifest["states"]) == sorted(f for f in files if f != "MANIFEST.json")

    loaded = {}
    for name in files:
        raw = Path(latest, name).read_bytes()
        try:
            loaded[name] = json.loads(raw.decode("utf-8"))
            continue
        except (UnicodeDecodeError, ValueError):
            pass
        loaded[name] = torch.load(Path(latest, name), weights_only=True)

    assert loaded["adaptdl-epoch"]["finished_epochs"] == 1
    assert loaded["adaptdl-epoch"]["finished"] is False  # (interrupted in epoch 1 of 2)
    assert loaded["adaptdl-dataloader-0"]["current_index"] == report["loader_index"] > 0
    training = loaded["adaptdl-dataparallel"]
    assert {"model", "optimizer", "lr_scheduler", "mp_scaler", "torch_rng"} <= set(training)
    assert training["optimizer"]["state"], "the optimizer took steps: momentum buffers"
    assert training["lr_scheduler"] is not None
    accum = next(v for k, v in loaded.items() if k.startswith("adaptdl-accumulator-"))
    results = accum["results"]
    assert results["n"] == report["accum_n"]
    assert results["np_scalar"] == pytest.approx(report["np_scalar"])
    assert torch.equal(torch.as_tensor(results["np_array"]),
                       torch.tensor(report["np_array"], dtype=results["np_array"].dtype))
    assert float(results["tensor"]) == pytest.approx(report["tensor"])
    # The checks the job did on the API after init_process_group.
    assert "optimizer" in report["adp_bad_optimizer"]
    assert "already called" in report["init_twice"]
