"""The simulator's elastic cluster: node-hours, start-up delays, scale-down,
preemptions with and without notice, the goodput and throughput rules, and the command line."""

from __future__ import annotations

import math

import pytest

import adaptdl_core.sim.__main__ as cli
from adaptdl_core.decision import speedup_from_hints
from adaptdl_core.policy import ClusterSizeRule, PolluxPolicy
from adaptdl_core.policy.cluster_size import ClusterSizeDecision
from adaptdl_core.sim.autoscale import (Autoscaler, ElasticCluster, ElasticSettings,
                                        throughput_hints)
from adaptdl_core.sim.baselines import FixedSharePolicy
from adaptdl_core.sim.cluster import simulate
from adaptdl_core.sim.job_model import SimJob, get_application
from adaptdl_core.sim.rounds import ArrivalAdmission, Observer, Schedule, run_rounds

from .workloads import small_rows


class _Wants:
    """A stand-in autoscaler that always wants ``n`` nodes."""

    def __init__(self, n):
        self.n = n
        self.calls = []

    def decide(self, now, jobs, allocations, current):
        self.calls.append((now, current))
        return ClusterSizeDecision(self.n, current, "grow" if self.n > current else "hold")


def _autoscaled(wants, startup=180.0, **kw):
    cluster = ElasticCluster(ElasticSettings(autoscale=True, min_nodes=1, max_nodes=8,
                                             node_startup_s=startup, **kw),
                             nodes=8, gpus_per_node=4, interval=60.0)
    cluster.autoscaler = _Wants(wants)
    return cluster


def test_fixed_cluster_node_hours_and_cost():
    cluster = ElasticCluster(ElasticSettings(node_hour_cost=2.5), nodes=3, gpus_per_node=4,
                             interval=60.0)
    assert cluster.update(0.0, {}, {}) == {0: 4, 1: 4, 2: 4}
    books = cluster.summary(1800.0)
    assert books["node_hours"] == pytest.approx(1.5)
    assert books["cost"] == pytest.approx(3.75)
    assert books["preemptions"] == 0 and books["nodes_added"] == 0
    assert books["mean_nodes"] == pytest.approx(3.0)


def test_new_nodes_are_usable_after_the_startup_delay_and_count_from_the_request():
    cluster = _autoscaled(3, startup=180.0)
    assert set(cluster.update(0.0, {}, {})) == {0}          # two more asked for at 0
    assert cluster.size(0.0) == 3
    assert set(cluster.update(120.0, {}, {})) == {0}
    assert set(cluster.update(180.0, {}, {})) == {0, 1, 2}
    books = cluster.summary(360.0)
    # Every node counts from its request (t = 0) to the end: 3 x 360 s.
    assert books["node_hours"] == pytest.approx(3 * 360 / 3600)
    assert books["nodes_added"] == 2 and books["peak_nodes"] == 3
    assert books["node_timeline"] == [[0.0, 3, 1], [180.0, 3, 3]]


def test_scale_down_removes_the_least_used_nodes_at_once():
    cluster = _autoscaled(3, startup=0.0)
    assert set(cluster.update(0.0, {}, {})) == {0, 1, 2}
    cluster.autoscaler.n = 1
    # The job holds node 1: nodes 2 and 0 go (newest first among the unused).
    assert set(cluster.update(60.0, {}, {"job": [1, 1]})) == {1}
    assert [n.removed_at for n in cluster.nodes] == [60.0, None, 60.0]
    books = cluster.summary(120.0)
    assert books["nodes_scaled_down"] == 2
    assert books["node_hours"] == pytest.approx((60 + 120 + 60) / 3600)


def test_scale_down_prefers_nodes_still_starting():
    cluster = _autoscaled(3, startup=300.0)
    cluster.update(0.0, {}, {})                               # 1 ready, 2 starting
    cluster.autoscaler.n = 1
    assert set(cluster.update(60.0, {}, {"job": [0]})) == {0}
    removed = [n for n in cluster.nodes if not n.alive()]
    assert [n.id for n in removed] == [1, 2] and all(n.why == "scale-down" for n in removed)
    # Nodes 1 and 2 counted for the minute they were asked for.
    assert cluster.summary(60.0)["node_hours"] == pytest.approx((60 + 60 + 60) / 3600)


def test_preempted_node_is_replaced_after_the_startup_delay_without_autoscaling():
    cluster = ElasticCluster(ElasticSettings(node_startup_s=100.0, preemption_notice_s=60.0),
                             nodes=2, gpus_per_node=4, interval=60.0)
    node = cluster.nodes[0]
    node.notice_at, node.lost_at = 1000.0, 1060.0
    assert set(cluster.update(960.0, {}, {})) == {0, 1}
    assert set(cluster.update(1020.0, {}, {})) == {1}         # out from its notice
    assert set(cluster.update(1080.0, {}, {})) == {1}         # lost at 1060, replacement
    assert cluster.nodes[2].requested_at == 1060.0 and cluster.nodes[2].ready_at == 1160.0
    assert set(cluster.update(1200.0, {}, {})) == {1, 2}
    books = cluster.summary(3600.0)
    assert books["preemptions"] == 1
    assert books["node_hours"] == pytest.approx((1060 + 3600 + (3600 - 1060)) / 3600)


class _Progress(Observer):
    def __init__(self):
        self.at = {}

    def allocated(self, now, jobs, allocations, decided):
        for job in jobs.values():
            self.at[now] = job.progress


def _one_job_on_one_node(notice_s, lost_after_s):
    app = get_application("cifar10")
    job = SimJob("a", app, 0.0, target_batch_size=app.init_batch_size, restart_s=0.0)
    cluster = ElasticCluster(ElasticSettings(node_startup_s=60.0, preemption_notice_s=notice_s,
                                             checkpoint_s=600.0),
                             nodes=1, gpus_per_node=4, interval=60.0)
    cluster.nodes[0].notice_at = lost_after_s
    cluster.nodes[0].lost_at = lost_after_s + notice_s
    seen = _Progress()
    run_rounds(FixedSharePolicy(4), ArrivalAdmission([job]), nodes=cluster.usable_nodes(0.0),
               schedule=Schedule(tick=60.0, interval=60.0), observer=seen, max_time=1800.0,
               cluster=cluster)
    return job, cluster, seen


def test_preemption_with_notice_moves_the_job_without_losing_progress():
    job, cluster, seen = _one_job_on_one_node(notice_s=60.0, lost_after_s=1010.0)
    times = sorted(seen.at)
    assert all(seen.at[a] <= seen.at[b] for a, b in zip(times, times[1:]))
    assert cluster.rollbacks == 0 and cluster.progress_lost_s == 0.0
    # Stopped at the notice (1020), back on the replacement (asked at 1070, ready 1130).
    assert seen.at[1020.0] == seen.at[1080.0] == seen.at[1140.0] < seen.at[1200.0]
    assert job.num_restarts == 1 and cluster.summary(1800.0)["preemptions"] == 1


def test_preemption_without_notice_rolls_back_to_the_last_checkpoint():
    job, cluster, seen = _one_job_on_one_node(notice_s=0.0, lost_after_s=1010.0)
    assert cluster.rollbacks == 1
    # Checkpoints every 600 s of running: the last before the loss was at t = 600.
    assert cluster.progress_lost_s == pytest.approx(1020.0 - 600.0)
    assert seen.at[1020.0] == pytest.approx(seen.at[600.0])
    assert seen.at[1020.0] < seen.at[960.0]


def _trained_job():
    job = SimJob("im", get_application("imagenet"), 0.0)
    for placement in ((1,), (2,), (4,)):
        job.reallocate(placement)
        job.advance(300.0)
    return job


def test_throughput_hints_take_statistical_efficiency_as_one():
    hints = _trained_job().hints().to_dict()
    plain, flat = speedup_from_hints(hints), speedup_from_hints(throughput_hints(hints))
    assert flat(1, 8) > plain(1, 8)            # no efficiency loss at the larger batch
    assert throughput_hints({"grad_params": None}) == {"grad_params": None}


def test_rule_choice_throughput_rule_wants_at_least_the_goodput_rules_size():
    job = _trained_job()
    jobs, allocs = {"im": job}, {"im": [0, 0, 0, 0]}
    rule = ClusterSizeRule({"GPU": 4}, 1, 4, policy=PolluxPolicy(fair_share=True))
    good = Autoscaler(rule, "goodput").decide(600.0, jobs, allocs, 1)
    thru = Autoscaler(rule, "throughput").decide(600.0, jobs, allocs, 1)
    assert thru.desired_nodes >= good.desired_nodes
    assert thru.utilities[2] > good.utilities[2]
    with pytest.raises(ValueError, match="measure must be one of goodput, throughput"):
        Autoscaler(rule, "latency")


def test_fixed_cluster_through_the_elastic_path_changes_no_result():
    rows = small_rows()
    plain = simulate(rows, "pollux", nodes=2)
    books = simulate(rows, "pollux", nodes=2, elastic=ElasticSettings(node_hour_cost=3.0))
    assert books["jcts"] == plain["jcts"] and "node_hours" not in plain
    last = max(r.time + plain["jcts"][r.name] for r in rows)
    assert books["node_hours"] == pytest.approx(2 * last / 3600)
    assert books["cost"] == pytest.approx(3 * books["node_hours"])


def test_autoscaled_run_with_preemptions_completes_every_job():
    rows = small_rows()
    result = simulate(rows, "pollux", nodes=4, seed=1, elastic=ElasticSettings(
        autoscale=True, min_nodes=1, max_nodes=4, rule="throughput",
        preemptions_per_node_hour=1.0, preemption_notice_s=60.0))
    assert result["completed"] == result["num_jobs"] == len(rows)
    books = result["elastic"]
    assert result["preemptions"] >= 1 and books["rollbacks"] == 0
    assert 0 < result["node_hours"] <= 4 * books["node_timeline"][-1][0] / 3600 + 4
    assert books["settings"]["rule"] == "throughput" and books["settings"]["max_nodes"] == 4
    assert math.isfinite(result["avg_jct"])


# -- bad settings ---------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--autoscale", "--autoscale-rule", "latency"],
     "rule must be one of goodput, throughput, got 'latency'"),
    (["--min-nodes", "2"], "min_nodes=2 applies with autoscale=True (--autoscale) only"),
    (["--autoscale", "--min-nodes", "0"], "min_nodes must be an integer >= 1, got 0"),
    (["--autoscale", "--min-nodes", "4", "--max-nodes", "2"],
     "max_nodes must be an integer >= 4, got 2"),
    (["--autoscale", "--min-nodes", "20"], "max_nodes (16, from --max-nodes or --nodes) must "
     "be >= min_nodes (20)"),
    (["--autoscale", "--autoscale-every", "0"], "autoscale_every must be an integer >= 1"),
    (["--node-startup-s", "-1"], "node_startup_s must be a finite number of seconds >= 0"),
    (["--node-hour-cost", "nan"], "node_hour_cost must be a finite cost per node-hour"),
    (["--preemptions-per-node-hour", "-0.1"], "preemptions_per_node_hour must be a finite "
     "rate per node-hour >= 0, got -0.1"),
    (["--preemption-notice-s", "inf"], "preemption_notice_s must be"),
    (["--checkpoint-s", "0"], "checkpoint_s must be a finite number of seconds > 0"),
])
def test_cli_rejects_bad_elastic_settings(capsys, extra, message):
    status = cli.main(["cluster", "--workload", "load-1.0/workload-1", "--policy", "pollux",
                       *extra])
    err = capsys.readouterr().err
    assert status == 2 and message in err, err


def test_cli_rejects_autoscaling_a_tuned_baseline(capsys):
    status = cli.main(["cluster", "--workload", "load-1.0/workload-1", "--policy",
                       "tiresias", "--autoscale"])
    err = capsys.readouterr().err
    assert status == 2 and "use pollux or adaptdl" in err


def test_cli_reports_the_books(tmp_path, capsys):
    import json

    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "ncf-0,0,ncf,1,32768\n")
    out = tmp_path / "r.json"
    status = cli.main(["cluster", "--workload", str(path), "--policy", "pollux", "--autoscale",
                       "--max-nodes", "2", "--node-hour-cost", "4", "--out", str(out)])
    assert status == 0
    assert "node-h" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("node_hours", "cost", "preemptions", "avg_jct", "makespan", "elastic"):
        assert key in data
    assert data["cost"] == pytest.approx(4 * data["node_hours"])
