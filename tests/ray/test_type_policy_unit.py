"""Choosing a type-aware policy on Ray, without Ray: ``adaptdl-ray start --policy``, the
one warning a mixed cluster under a type-unaware policy gives, and the cluster allocator
dividing a mixed cluster by type (each job's share on nodes of one type)."""

from __future__ import annotations

import logging

import pytest

from adaptdl_core.decision import CoreDriver, DecisionCore, JobSpec, NodeInfo
from adaptdl_core.policy import (PolluxPolicy, RemainingWorkPolicy, knows_types,
                                 placement_type, type_unaware_note)
from adaptdl_core.policy import typed as typed_module
from adaptdl_ray import cli
from adaptdl_ray.cli.allocator_verbs import policy_option

MIXED = {"a": NodeInfo({"GPU": 4}, accelerator_type="T4"),
         "b": NodeInfo({"GPU": 4}, accelerator_type="A100")}


@pytest.mark.parametrize("argv, expected", [([], None), (["--policy", "adaptdl"], "adaptdl"),
                                            (["--policy", "pollux"], "pollux")])
def test_start_takes_a_policy_name(argv, expected):
    opts = cli.build_parser().parse_args(["start", *argv])
    assert policy_option(opts) == expected


def test_a_bad_policy_name_is_one_line_naming_the_flag_and_the_names():
    opts = cli.build_parser().parse_args(["start", "--policy", "sia"])
    with pytest.raises(cli.CliError) as err:
        policy_option(opts)
    text = str(err.value)
    assert "\n" not in text and "--policy 'sia'" in text
    assert "pollux" in text and "adaptdl" in text


def test_start_with_a_bad_policy_fails_before_connecting(capsys, monkeypatch):
    from adaptdl_ray.cli import allocator_verbs
    monkeypatch.setattr(allocator_verbs, "Cluster",
                        lambda *a: pytest.fail("connected before checking --policy"))
    assert cli.main(["start", "--policy", "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("adaptdl-ray: error: --policy 'nope'") and "\n" not in err


def test_which_policies_know_types():
    assert knows_types(RemainingWorkPolicy()) and not knows_types(PolluxPolicy())
    assert type_unaware_note(RemainingWorkPolicy(), MIXED) is None
    assert type_unaware_note(PolluxPolicy(), {"a": MIXED["a"]}) is None
    note = type_unaware_note(PolluxPolicy(), MIXED)
    assert "T4, A100" in note and "pollux" in note and "--policy adaptdl" in note


def test_a_mixed_cluster_under_a_type_unaware_policy_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(typed_module, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=typed_module.__name__):
        for _ in range(2):
            core = DecisionCore(policy="pollux")
            core.set_nodes(MIXED)
            core.set_nodes({"a": MIXED["a"]})
            core.set_nodes(MIXED)
    assert caplog.text.count("ignores them") == 1


def test_a_type_aware_policy_does_not_warn(monkeypatch, caplog):
    monkeypatch.setattr(typed_module, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=typed_module.__name__):
        DecisionCore(policy="adaptdl").set_nodes(MIXED)
    assert "ignores them" not in caplog.text


def test_the_allocator_divides_a_mixed_cluster_by_type(tmp_path):
    """Its capacity keeps each node's type, so the adaptdl policy gives each job nodes of
    one type, and the job's own core names that type in its decision."""
    from adaptdl_ray.cluster.allocator import ClusterAllocator
    totals = {k: dict(v.resources) for k, v in MIXED.items()}
    types = {k: v.accelerator_type for k, v in MIXED.items()}
    allocator = ClusterAllocator(str(tmp_path), policy="adaptdl",
                                 nodes_fn=lambda: (totals, totals, types))
    core = DecisionCore(policy="adaptdl")
    core.set_nodes(MIXED)
    for name in ("j1", "j2"):
        core.add_job(name, JobSpec({"GPU": 1}, 1, 4))

    def solver(request):
        reply = allocator.sync("m", request.to_plain())
        request.accept(reply["allocations"], reply.get("unfit"))

    decisions = CoreDriver(core, solve_wait_s=None, solver=solver).decide()
    for d in decisions.values():
        assert d.action == "start" and d.accelerator_type is not None
        assert placement_type(MIXED, d.nodes) == d.accelerator_type
