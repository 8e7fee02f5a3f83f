"""StateWriter: snapshots written in a background thread, newest last, atomically."""

from __future__ import annotations

import json
import logging
import pickle
import threading

import pytest

from adaptdl_core.decision import CoreState, JobRecord, StateWriter
from adaptdl_core.decision import state as state_module


def snapshot(n):
    return CoreState({"a": JobRecord(created=float(n))}, float(n), n).to_json()


def test_the_newest_snapshot_is_written_and_a_burst_costs_at_most_two_writes(
        tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    written = []
    real = state_module.write_atomic

    def slow_write(directory, name, text):
        written.append(json.loads(text)["num_allocations"])
        started.set()
        release.wait(10)
        return real(directory, name, text)

    monkeypatch.setattr(state_module, "write_atomic", slow_write)
    writer = StateWriter()
    writer.submit(str(tmp_path), snapshot(1))
    assert started.wait(10)
    for n in range(2, 6):  # while the first write is stuck: all but the last are dropped
        writer.submit(str(tmp_path), snapshot(n))
    assert writer.busy and not writer.flush(timeout=0.05)
    release.set()
    assert writer.flush(timeout=10) and not writer.busy
    assert written == [1, 5] and writer.writes == 2
    assert CoreState.load(str(tmp_path)).num_allocations == 5
    assert not [p for p in tmp_path.iterdir() if p.name != CoreState.FILE]  # no tmp left


def test_a_failed_write_is_logged_and_the_next_one_retries(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    writer = StateWriter(sync=True)
    with caplog.at_level(logging.WARNING, logger=state_module.__name__):
        writer.submit(str(blocker / "sub"), snapshot(1))  # cannot create the directory
    assert writer.failures == 1 and "could not save the scheduler state" in caplog.text
    writer.submit(str(tmp_path), snapshot(2))  # sync: written before submit returns
    assert writer.writes == 1 and CoreState.load(str(tmp_path)).num_allocations == 2


def test_the_writer_pickles_without_its_thread_and_names_bad_arguments(tmp_path):
    writer = StateWriter()
    writer.submit(str(tmp_path), snapshot(3))
    assert writer.flush(10)
    again = pickle.loads(pickle.dumps(writer))
    assert again.writes == 1 and not again.busy
    again.submit(str(tmp_path), snapshot(4))
    assert again.flush(10) and CoreState.load(str(tmp_path)).num_allocations == 4
    with pytest.raises(TypeError, match="two strings"):
        writer.submit(tmp_path, snapshot(5))
