"""The pieces of a submitted job that need no cluster: its files under the storage path,
the local sizer, the replicas' script runner and the job options."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import pytest

from adaptdl_core.checkpoint import CheckpointError
from adaptdl_core.decision import JobSpec, NodeInfo
from adaptdl_ray.cluster import elastic_job
from adaptdl_ray.cluster.job_files import JobFiles, check_name
from adaptdl_ray.cluster.sizing import CoreSizer
from adaptdl_ray.replicas import transfer


def make_checkpoint(root: Path, seq: int, *, finished: bool = False, damaged: bool = False
                    ) -> Path:
    """An intact (or damaged) checkpoint ``root/checkpoint-<seq>`` with one state."""
    path = root / f"checkpoint-{seq}"
    path.mkdir(parents=True)
    data = json.dumps(seq).encode()
    (path / "s").write_bytes(data + (b"x" if damaged else b""))
    (path / "MANIFEST.json").write_text(json.dumps({
        "format": 2, "states": ["s"], "num_restarts": seq,
        "files": {"s": {"size": len(data), "crc32": zlib.crc32(data)}},
        "summary": {"adaptdl-epoch": {"finished_epochs": seq, "finished": finished}}}))
    return path


def test_store_checkpoint_keeps_the_newest_and_one_fallback(tmp_path):
    files = JobFiles("j", tmp_path / "store")
    src = tmp_path / "src"
    for seq in range(4):
        path = make_checkpoint(src, seq)
        files.store_checkpoint(transfer.pack_dir(str(path), path.name))
    assert sorted(p.name for p in files.checkpoint_path.iterdir()) == \
        ["checkpoint-2", "checkpoint-3"]
    point = files.resume_point()
    assert point.restarts == 3 and point.finished_epochs == 3 and not point.finished
    assert files.latest_checkpoint().endswith("checkpoint-3")


def test_store_checkpoint_refuses_damage_and_foreign_archives(tmp_path):
    files = JobFiles("j", tmp_path / "store")
    bad = make_checkpoint(tmp_path / "src", 0, damaged=True)
    with pytest.raises(CheckpointError):
        files.store_checkpoint(transfer.pack_dir(str(bad), bad.name))
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="one checkpoint-<seq> directory"):
        files.store_checkpoint(transfer.pack_dir(str(tmp_path / "other"), "other"))
    assert files.latest_checkpoint() is None  # nothing half-stored


def test_records_and_names(tmp_path):
    files = JobFiles("j", tmp_path)
    assert files.read_status() is None and not files.exists()
    files.write_status({"status": "running"})
    assert files.read_status()["status"] == "running" and "updated" in files.read_status()
    for bad in ("", "-x", "a/b", "a" * 64, None):
        with pytest.raises(ValueError, match="not valid"):
            check_name(bad)


def test_local_sizer_starts_within_bounds_and_keeps_the_jobs_record(tmp_path):
    nodes = {"n0": NodeInfo({"CPU": 3.0})}
    spec = JobSpec({"CPU": 1.0}, min_replicas=2, max_replicas=8)
    clock = iter(range(1000, 2000, 10)).__next__
    sizer = CoreSizer("j", spec, state_dir=str(tmp_path), nodes_fn=lambda: nodes,
                       clock=lambda: float(clock()))
    # A job nobody has profiled starts at its min_replicas, and keeps that size until it
    # reports a profile.
    assert sizer.start() == 2
    created = sizer.core.record("j").created
    sizer.observe(2)
    decision = sizer.decision()
    assert (decision.action, decision.replicas, decision.nodes) == ("keep", 2, ("n0", "n0"))
    sizer.end()
    again = CoreSizer("j", spec, state_dir=str(tmp_path), nodes_fn=lambda: nodes,
                       clock=lambda: float(clock()))
    again.start()
    assert again.core.record("j").created == created  # its age survives a new submission


def test_local_sizer_refuses_a_cluster_too_small(tmp_path):
    sizer = CoreSizer("j", JobSpec({"CPU": 1.0}, min_replicas=4), nodes_fn=lambda: {
        "n0": NodeInfo({"CPU": 2.0})})
    with pytest.raises(ValueError):
        sizer.start()


def test_run_script_runs_it_as_main_with_its_arguments(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    script = tmp_path / "s.py"
    script.write_text("import sys, json, helper\n"
                      "if __name__ == '__main__':\n"
                      f"    json.dump(sys.argv, open({str(out)!r}, 'w'))\n"
                      "    sys.exit(int(sys.argv[1]))\n")
    (tmp_path / "helper.py").write_text("")  # imported from the script's own directory
    argv = list(sys.argv)
    elastic_job.run_script({"script": str(script), "args": ["0", "--x"]})
    assert json.loads(out.read_text()) == [str(script), "0", "--x"]
    assert sys.argv == argv
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    with pytest.raises(RuntimeError, match="exited with status 3"):
        elastic_job.run_script({"script": str(script), "args": ["3"]})


def test_job_spec_from_options():
    parser = argparse.ArgumentParser()
    elastic_job.add_job_arguments(parser)
    spec = elastic_job.job_spec(parser.parse_args(
        ["--name", "j", "--min-replicas", "2", "--max-replicas", "4", "--gpus-per-replica",
         "1", "--cpus-per-replica", "2"]))
    assert spec == JobSpec({"CPU": 2.0, "GPU": 1.0}, 2, 4)
