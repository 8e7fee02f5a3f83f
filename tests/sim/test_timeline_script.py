"""benchmarks/sim_timeline.py: the rows it prints are the timeline's changes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_timeline.py"


def _script():
    spec = importlib.util.spec_from_file_location("sim_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_changes_keeps_the_entries_where_the_total_or_a_shown_job_changes():
    timeline = [{"t": 60.0, "gpus": {"a": 1}},
                {"t": 120.0, "gpus": {"a": 1}},             # nothing changed
                {"t": 180.0, "gpus": {"a": 1, "b": 2}},     # the total changed
                {"t": 240.0, "gpus": {"a": 2, "b": 1}},     # a changed, total not
                {"t": 300.0, "gpus": {"b": 3}},             # a ended
                {"t": 360.0, "gpus": {}}]
    assert _script().changes(timeline, ["a"]) == [
        (60.0, 1, [1]), (180.0, 3, [1]), (240.0, 3, [2]), (300.0, 3, [0]), (360.0, 0, [0])]
    assert _script().changes(timeline, ["a", "b"], start=200.0, end=300.0) == [
        (240.0, 3, [2, 1]), (300.0, 3, [0, 3])]


def test_on_a_typed_cluster_a_change_of_type_alone_is_a_change():
    timeline = [{"t": 60.0, "gpus": {"a": 8, "b": 4}, "types": {"a": "rtx", "b": "t4"}},
                {"t": 120.0, "gpus": {"a": 8, "b": 4}, "types": {"a": "a100", "b": "t4"}},
                {"t": 180.0, "gpus": {"a": 8, "b": 4}, "types": {"a": "a100", "b": "t4"}},
                {"t": 240.0, "gpus": {"a": 16, "b": 0}, "types": {"a": "a100"}}]
    assert _script().changes(timeline, ["a", "b"]) == [
        (60.0, {"rtx": 8, "t4": 4}, [(8, "rtx"), (4, "t4")]),
        (120.0, {"a100": 8, "t4": 4}, [(8, "a100"), (4, "t4")]),
        (240.0, {"a100": 16}, [(16, "a100"), (0, None)])]
