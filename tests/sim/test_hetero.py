"""The simulator on clusters of several GPU types: cluster specs, a small mixed-cluster
simulation under each policy, Pollux run type-unaware, the Sia baseline, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adaptdl_core.sim.cluster import simulate
from adaptdl_core.sim.gpu_types import (PRESETS, ClusterSpec, NodeGroup, cluster_spec,
                                        preferred_type)
from adaptdl_core.sim.job_model import SimJob, get_application
from adaptdl_core.sim.sia import SiaPolicy, sia_configs
from adaptdl_core.sim.typed import TypeUnawarePollux, make_typed_jobs, virtual_nodes

from .workloads import small_rows

TINY = ClusterSpec("tiny", (NodeGroup("t4", 1, 4), NodeGroup("a100", 1, 8)))


def test_presets_and_cluster_files(tmp_path):
    het = cluster_spec("sia-heterogeneous")
    assert het.gpus_by_type() == {"t4": 24, "rtx": 24, "a100": 16} and het.total_gpus == 64
    assert cluster_spec("sia-homogeneous").gpus_by_type() == {"t4": 64}
    (tmp_path / "c.json").write_text(json.dumps(
        {"nodes": [{"type": "quad", "count": 2}, {"type": "v100", "count": 1,
                                                  "gpus_per_node": 4}]}))
    spec = cluster_spec(tmp_path / "c.json")
    assert spec.node_gpus() == {0: 4, 1: 4, 2: 4}
    assert spec.node_types() == {0: "quad", 1: "quad", 2: "v100"}
    (tmp_path / "c.toml").write_text('[[nodes]]\ntype = "rtx"\ncount = 3\n')
    assert cluster_spec(tmp_path / "c.toml").gpus_by_type() == {"rtx": 24}


@pytest.mark.parametrize("text,match", [
    ('{"nodes": [{"type": "h200", "count": 1}]}', "has no traces; use one of t4"),
    ('{"nodes": [{"type": "t4"}]}', "needs 'type' and 'count'"),
    ('{"nodes": [{"type": "t4", "count": 0}]}', "count must be"),
    ('{"nodes": [{"type": "t4", "count": 1, "gpu": 4}]}', "unknown keys"),
    ('{"racks": []}', "expected a 'nodes' list"),
    ('{not json', "is not valid JSON"),
])
def test_bad_cluster_files_are_named(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        cluster_spec(path)


def test_bad_cluster_names_and_policies():
    with pytest.raises(ValueError, match="not a preset"):
        cluster_spec("sia-giant")
    with pytest.raises(FileNotFoundError):
        cluster_spec("missing.json")
    with pytest.raises(ValueError, match="needs a typed cluster"):
        simulate(small_rows(), "sia")
    with pytest.raises(ValueError, match="runs on the default one-type cluster"):
        simulate(small_rows(), "tiresias", cluster=TINY)


@pytest.mark.parametrize("policy,use_core", [("sia", None), ("pollux", None),
                                             ("pollux", False), ("adaptdl", None)])
def test_small_mixed_cluster_simulation(policy, use_core):
    # Pollux with use_core=False: its allocations applied as they are (sim_hetero.py).
    result = simulate(small_rows(), policy, cluster=TINY, use_core=use_core)
    if policy == "pollux":
        assert result["settings"]["pollux_path"] == \
            ("direct" if use_core is False else "decision-core")
    assert result["completed"] == result["num_jobs"] == 5
    assert result["cluster"] == "tiny"
    for key in ("avg_jct", "p99_jct", "makespan", "jcts", "decision_s"):
        assert key in result
    by_type = result["gpu_hours_by_type"]
    assert set(by_type) <= {"t4", "a100"}
    assert sum(by_type.values()) == pytest.approx(result["gpu_hours"])
    assert sum(result["jobs_by_type"].values()) == 5


def test_type_aware_policies_put_bert_on_a100():
    # BERT trains ~10x faster per GPU on an A100 than on a T4 (the traces): the
    # type-aware policies run the bert jobs on the a100 node.
    for policy in ("sia", "adaptdl"):
        result = simulate(small_rows(), policy, cluster=TINY, timeline=True)
        assert result["gpu_hours_by_type"].get("a100", 0.0) > \
            10 * result["gpu_hours_by_type"].get("t4", 0.0), policy
        # The timeline names the type of every running job, each round.
        bert = [e["types"][k] for e in result["timeline"] for k, g in e["gpus"].items()
                if k.startswith("bert") and g]
        assert bert and bert.count("a100") > 2 * bert.count("t4"), policy
        assert all(set(e["types"]) == {k for k, g in e["gpus"].items() if g}
                   for e in result["timeline"])


def test_typed_jobs_use_model_delays_calibration_and_per_type_limits():
    jobs = make_typed_jobs(small_rows()[:1], cluster_spec("sia-heterogeneous"),
                           type_aware=True)
    job = jobs[0]
    assert job.restart_s == 120.0 and job.slowdown == 1.2      # bert
    assert set(job.apps_by_type) == {"t4", "rtx", "a100"}
    assert job.apps_by_type["a100"].max_local_bsz > job.apps_by_type["t4"].max_local_bsz
    assert get_application("deepspeech2", gpu_type="rtx").max_local_bsz == 57
    # A placement beyond the a100 traces' two nodes is extrapolated by the type's fit.
    step, sync = get_application("imagenet", gpu_type="a100").step_time((8, 8, 8, 8), 100)
    assert step > sync > 0


def test_type_aware_agent_keeps_one_profile_per_type():
    apps = {t: get_application("cifar10", gpu_type=t) for t in ("t4", "a100")}
    job = SimJob("c", apps["t4"], 0.0, apps_by_type=apps)
    job.reallocate((1,), "t4")
    job.advance(120.0)
    job.reallocate((2,), "a100")
    job.advance(120.0)
    fits = job.fits_by_type()
    assert set(fits) == {"t4", "a100"} and fits["a100"][1] == 2
    merged = SimJob("m", apps["t4"], 0.0, apps_by_type=apps, type_aware=False)
    merged.reallocate((1,), "t4")
    merged.advance(120.0)
    merged.reallocate((2,), "a100")
    merged.advance(120.0)
    assert merged.fits_by_type() == {"a100": (merged.perf_params, 2)}
    assert {k[1] for k in merged.profile} == {1, 2}
    with pytest.raises(ValueError, match="gpu_type must be one of"):
        job.reallocate((1,), "rtx")


class _Fixed:
    """An inner policy that asks for fixed virtual-node allocations."""

    def __init__(self, out):
        self.out = out

    def decide(self, now, jobs, allocations, nodes):
        return self.out


def test_type_unaware_pollux_keeps_the_majority_type():
    spec = cluster_spec("sia-heterogeneous")
    vnodes = virtual_nodes(spec)
    # 6 t4 nodes stay whole (vnodes 0-5); each 8-GPU node becomes two 4-GPU vnodes.
    assert len(vnodes) == 6 + 2 * 3 + 2 * 2 and vnodes[6] == vnodes[7] == (6, 4)
    # Job a: 4 t4 GPUs + 2 rtx: keeps the t4 ones. Job b: 2 rtx + 2 a100: a tie, a100 wins.
    policy = TypeUnawarePollux(_Fixed({"a": [0, 0, 0, 0, 6, 6], "b": [7, 7, 12, 12]}), spec)
    out = policy.decide(0.0, {"a": None, "b": None}, {}, spec.node_gpus())
    assert out == {"a": [0, 0, 0, 0], "b": [9, 9]}
    assert policy.dropped_gpus == 4
    assert preferred_type({"rtx": 2, "quad": 2}) == "quad"


def test_sia_configurations_and_choice():
    assert sia_configs(4, 3) == [(1, 1), (1, 2), (1, 4), (2, 8), (3, 12)]
    assert sia_configs(8, 2) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16)]
    policy = SiaPolicy(TINY)
    jobs = {j.name: j for j in make_typed_jobs(small_rows()[:1], TINY, type_aware=True)}
    # A job with no fit anywhere: one GPU of some type.
    first = policy.decide(60.0, jobs, {}, TINY.node_gpus())
    assert len(first["bert-34"]) == 1
    with pytest.raises(ValueError, match="lambda_n"):
        SiaPolicy(TINY, lambda_n=0.5)


def test_sia_lets_a_job_measured_on_one_gpu_try_two():
    # A job that has run on one GPU only has no measured sync cost. Sia takes it as free
    # (as adaptdl's policy does), so with the cluster idle it gets two GPUs, not one.
    apps = {t: get_application("cifar10", gpu_type=t) for t in ("t4", "a100")}
    job = SimJob("c", apps["t4"], 0.0, apps_by_type=apps)
    job.reallocate((1,), "t4")
    job.advance(120.0)
    assert job.fits_by_type()["t4"][1] == 1
    out = SiaPolicy(TINY).decide(180.0, {"c": job}, {"c": [0]}, TINY.node_gpus())
    assert len(out["c"]) == 2


def test_cli_runs_a_typed_cluster_and_rejects_mixed_options(tmp_path):
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\n"
                  "bert-1,0,bert,1,12\nncf-2,10,ncf,1,256\n")
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "adaptdl_core.sim", "cluster", "--workload", str(wl),
         "--cluster", "sia-heterogeneous", "--policy", "adaptdl", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["cluster"] == "sia-heterogeneous" and result["completed"] == 2
    assert "GPU-h by type" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "adaptdl_core.sim", "cluster", "--workload", str(wl),
         "--cluster", "sia-heterogeneous", "--nodes", "4", "--policy", "sia"],
        capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "drop --nodes" in bad.stderr
    assert PRESETS["sia-heterogeneous"].describe() == "6x4 t4 + 3x8 rtx + 2x8 a100"
