"""The cluster allocator's autoscaling: Pollux's cluster-size rule over every job on the
cluster, asked of Ray's autoscaler through one standing request (no Ray: the cluster's
nodes and the autoscaler are injected)."""

from __future__ import annotations

import json

import pytest

from adaptdl_core.decision import CoreDriver, DecisionCore, JobSpec, NodeInfo
from adaptdl_ray import cli
from adaptdl_ray.cli.allocator_verbs import autoscale_options
from adaptdl_ray.cluster import client
from adaptdl_ray.cluster.allocator import AUTOSCALE_FILE, ClusterAllocator, template_nodes
from tests.decision.test_core import GOOD_4

NODE = {"CPU": 4}
OPTIONS = {"node_template": NODE, "min_nodes": 1, "max_nodes": 4}


class Cluster:
    """One 4-CPU node, and a recorder in place of ``request_resources``."""

    def __init__(self):
        self.totals = {"head": dict(NODE)}
        self.requests = []

    def nodes(self):
        return self.totals, self.totals

    def request(self, **kwargs):
        self.requests.append(kwargs["bundles"])

    def allocator(self, state_dir):
        return ClusterAllocator(str(state_dir), nodes_fn=self.nodes, request_fn=self.request,
                                autoscale_interval_s=0.0)


def experiment(allocator, member, names, spec=JobSpec({"CPU": 1})):
    """A front-end whose solves go to ``allocator`` (as AllocatorSolver does)."""
    core = DecisionCore(interval_s=60.0)
    core.set_nodes({"head": NodeInfo(NODE)})

    def solver(request):
        reply = allocator.sync(member, request.to_plain(), label=member)
        request.accept(reply["allocations"], reply["unfit"])

    driver = CoreDriver(core, solve_wait_s=None, solver=solver)
    for name in names:
        core.add_job(name, spec)
        core.update(name, hints=GOOD_4)
    driver.step()
    return driver


def test_jobs_that_scale_ask_for_nodes_and_the_request_is_withdrawn_when_they_end(tmp_path):
    cluster = Cluster()
    allocator = cluster.allocator(tmp_path)
    state = allocator.set_autoscale(OPTIONS)
    # No jobs: the rule keeps min_nodes (one node: the request asks for one).
    assert state["last"]["desired_nodes"] == 1 and state["last"]["current_nodes"] == 1
    assert cluster.requests == [[NODE]]
    # Three jobs that scale well: the goodput per CPU stays above U up to 4 nodes.
    experiment(allocator, "sweep", ["a", "b", "c"])
    last = allocator.status()["autoscale"]["last"]
    assert last["action"] == "grow" and last["desired_nodes"] == 4, last
    assert cluster.requests[-1] == [NODE] * 4
    # The experiment ends: back to min_nodes; at or below baseline the request goes.
    allocator.leave("sweep")
    allocator.sync("idle", {"jobs": {}})
    assert allocator.status()["autoscale"]["last"]["desired_nodes"] == 1
    assert cluster.requests[-1] == [NODE]
    allocator.set_autoscale(None)
    assert cluster.requests[-1] == [] and allocator.status()["autoscale"] is None


def test_jobs_that_do_not_scale_do_not_grow_the_cluster(tmp_path):
    cluster = Cluster()
    allocator = cluster.allocator(tmp_path)
    allocator.set_autoscale(dict(OPTIONS, baseline_nodes=1))
    experiment(allocator, "sweep", ["a", "b", "c"], JobSpec({"CPU": 1}, max_replicas=1))
    last = allocator.status()["autoscale"]["last"]
    assert last["desired_nodes"] == 1 and last["action"] == "hold", last
    # Wanting no more than the baseline: the request is withdrawn (never pins the nodes).
    assert cluster.requests == [[]]


def test_the_options_survive_a_restart_of_the_allocator(tmp_path):
    cluster = Cluster()
    cluster.allocator(tmp_path).set_autoscale(OPTIONS)
    assert json.loads((tmp_path / AUTOSCALE_FILE).read_text()) == OPTIONS
    again = cluster.allocator(tmp_path)
    assert again.status()["autoscale"]["options"] == OPTIONS
    experiment(again, "sweep", ["a", "b", "c"])
    # A restarted allocator does not know what stands: its first request goes out.
    assert cluster.requests[-1] == [NODE] * 4
    again.set_autoscale(None)
    assert json.loads((tmp_path / AUTOSCALE_FILE).read_text()) is None
    assert cluster.allocator(tmp_path).status()["autoscale"] is None


@pytest.mark.parametrize("options, words", [
    (dict(OPTIONS, max_nodes=0), "max_nodes"),
    ({"node_template": NODE, "min_nodes": 1}, "max_nodes"),
    (dict(OPTIONS, node_template={"CPU": 0}), "node_template"),
    (dict(OPTIONS, nodes=3), "unknown autoscale option"),
    (dict(OPTIONS, lower=0.9, upper=0.5), "lower"),
])
def test_bad_options_are_named_and_change_nothing(tmp_path, options, words):
    cluster = Cluster()
    allocator = cluster.allocator(tmp_path)
    allocator.set_autoscale(OPTIONS)
    with pytest.raises(ValueError, match=words):
        allocator.set_autoscale(options)
    with pytest.raises(ValueError, match=words):
        client.check_autoscale(options)
    assert allocator.status()["autoscale"]["options"] == OPTIONS


def test_template_nodes_counts_the_nodes_that_hold_a_whole_template():
    totals = {"head": {"CPU": 2}, "w1": {"CPU": 8, "GPU": 1}, "w2": {"CPU": 8}}
    assert template_nodes(totals, {"CPU": 8}) == 2
    assert template_nodes(totals, {"CPU": 8, "GPU": 1}) == 1


@pytest.mark.parametrize("argv, expected", [
    ([], None),
    (["--no-autoscale"], {}),
    (["--autoscale", "--min-nodes", "1", "--max-nodes", "3", "--node-template",
      '{"CPU": 8, "GPU": 1}'],
     {"node_template": {"CPU": 8, "GPU": 1}, "min_nodes": 1, "max_nodes": 3}),
])
def test_start_turns_autoscaling_on_or_off_or_leaves_it(argv, expected):
    opts = cli.build_parser().parse_args(["start", *argv])
    assert autoscale_options(opts) == expected


@pytest.mark.parametrize("argv, words", [
    (["--autoscale", "--min-nodes", "1"], "--autoscale needs --max-nodes --node-template"),
    (["--min-nodes", "1"], "--min-nodes needs --autoscale"),
    (["--no-autoscale", "--max-nodes", "2"], "--no-autoscale takes no other"),
    (["--autoscale", "--min-nodes", "1", "--max-nodes", "2", "--node-template", "CPU"],
     "--node-template must be JSON"),
    (["--autoscale", "--min-nodes", "3", "--max-nodes", "2", "--node-template",
      '{"CPU": 4}'], "max_nodes"),
])
def test_start_names_a_bad_autoscaling_option(argv, words):
    opts = cli.build_parser().parse_args(["start", *argv])
    with pytest.raises(cli.CliError, match=words):
        autoscale_options(opts)
