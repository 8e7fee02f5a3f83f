"""The cluster simulator: the baselines against the paper's published runs, the CLI, pollux."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adaptdl_core.sim.cluster import load_workload, published, simulate, synthetic_workload

from .workloads import small_rows


@pytest.mark.parametrize("policy,workload", [("tiresias", "workload-3"),
                                             ("optimus", "workload-5")])
def test_baseline_reproduces_published_average_and_per_job(policy, workload):
    result = simulate(f"load-0.5/{workload}", policy)
    pub = published(policy, "0.5")
    assert result["completed"] == result["num_jobs"] == 80
    # The artifact's baselines are deterministic: equal to the published runs, job by job
    # (up to float formatting of the published JSON).
    assert result["avg_jct"] == pytest.approx(pub["avgs"][workload], rel=1e-9)
    jcts = pub["jcts"][workload]
    assert set(result["jcts"]) == set(jcts)
    for name, published_jct in jcts.items():
        assert result["jcts"][name] == pytest.approx(published_jct, rel=1e-9), name


def test_workload_names_and_errors():
    rows = load_workload("load-1.0/workload-1")
    assert len(rows) == 160 and rows[0].application in {"bert", "cifar10", "deepspeech2",
                                                         "imagenet", "ncf", "yolov3"}
    with pytest.raises(FileNotFoundError, match="load-0.5/workload-1"):
        load_workload("load-9/workload-1")
    with pytest.raises(ValueError, match="policy must be one of"):
        simulate("load-0.5/workload-1", "fifo")
    with pytest.raises(ValueError, match="more GPUs than the cluster"):
        simulate("load-0.5/workload-1", "tiresias", nodes=1)


def test_synthetic_workload_keeps_the_mix_and_scales_arrivals():
    base = load_workload("load-1.0/workload-1")
    big = synthetic_workload(640, 64, seed=1)
    assert len(big) == 640 and len({r.name for r in big}) == 640
    assert {r.application for r in big} <= {r.application for r in base}
    # Same jobs per node: the arrival window keeps its length.
    span_base = max(r.time for r in base) - min(r.time for r in base)
    span_big = max(r.time for r in big) - min(r.time for r in big)
    assert span_big == pytest.approx(span_base, rel=0.1)


def test_cli_writes_the_result_json(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "adaptdl_core.sim", "cluster", "--workload",
         "load-0.5/workload-3", "--policy", "tiresias", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    for key in ("policy", "workload", "avg_jct", "p99_jct", "makespan", "jcts", "gpu_hours",
                "decision_s"):
        assert key in data
    assert data["policy"] == "tiresias" and len(data["jcts"]) == 80
    assert data["p99_jct"] >= data["avg_jct"] > 0
    assert set(data["decision_s"]) == {"median", "p99", "max"}
    bad = subprocess.run([sys.executable, "-m", "adaptdl_core.sim", "cluster", "--workload",
                          "nope", "--policy", "tiresias"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "workload" in bad.stderr


def test_pollux_completes_a_small_workload_through_the_decision_core():
    rows = small_rows()
    result = simulate(rows, "pollux", nodes=4)
    assert result["completed"] == result["num_jobs"] == len(rows) == 5
    assert result["settings"]["pollux_path"] == "decision-core"
    assert result["num_fits"] > 0  # the agents refitted their throughput models
    # Adaptive jobs finish no later than the same jobs at their tuned size on this cluster.
    fixed = simulate(rows, "tiresias", nodes=4)
    assert result["avg_jct"] < fixed["avg_jct"]


def test_core_pollux_dates_jobs_from_their_submission():
    from adaptdl_core.sim.job_model import SimJob, get_application
    from adaptdl_core.sim.pollux import CorePollux

    pol = CorePollux()
    job = SimJob("b", get_application("bert"), submission_time=17.0)
    out = pol.decide(60.0, {"b": job}, {}, {0: 4})
    assert len(out["b"]) >= 1
    # The round boundary is 60 s, but the job's age (restart penalty) counts from 17 s.
    assert pol.core.state.jobs["b"].created == 17.0
