"""Many short trials: AdaptDL trials against plain Tune function trials doing the same work.

Each trial trains a small MLP for 3 epochs on 2,000 synthetic samples (its own seed) and
reports once per epoch. The arms run one after the other in the same run, on the same
private local Ray instance (``ray.init(address="local", num_cpus=8)`` by default: 8
trials at a time, each of one replica on one CPU):

* ``fifo``: a plain function trainable (torch only) under Tune's FIFO scheduler, with
  Tune's default ``reuse_actors`` (False).
* ``adaptdl-noreuse``: ``AdaptDLTrainableCreator`` (min = max = 1 replica) under
  ``AdaptDLScheduler``, also with ``reuse_actors=False``: the like-with-like comparison
  for ``fifo``.
* ``fifo-reuse``, ``adaptdl``: the same two with ``reuse_actors=True`` (a warm trial actor
  serves the next trial; AdaptDL's one replica runs inside the trial actor, so a trial has
  one process either way).

Each AdaptDL arm is compared with the plain arm of the same ``reuse_actors`` setting
(``wall / plain``), never across settings. The arms run in the order given (``--arms``;
default ``adaptdl-noreuse,fifo,fifo-reuse,adaptdl``), after a warm-up that is not
measured: one plain trial per CPU that only imports torch, so that no arm pays Ray's own
first start of worker processes (worth several seconds to whichever arm ran first). The
first AdaptDL arm still pays the cluster allocator's start, as a user's first sweep on a
fresh Ray instance does.

For each arm: wall time, per-trial run time (Tune's ``on_trial_start`` to its end), the
longest wait (a trial first seen pending to its start), how many trials started in a
reused process, the placement groups left at the end, and where a trial's first seconds
went (from timestamps the training function takes: its process's creation (for AdaptDL
the trial actor's, whose start, ``import adaptdl_ray`` included, this phase then holds), the
function's start, the process group joined, the first optimizer step, the first report;
and for AdaptDL the trial actor's launch, from ``adaptdl/launch_s``).

    python benchmarks/many_trials.py                # 100 trials per arm, four arms
    python benchmarks/many_trials.py --quick        # 20 trials per arm
    python benchmarks/many_trials.py --arms fifo-reuse,adaptdl --trials 40
    python benchmarks/many_trials.py --arms fifo-reuse,adaptdl --repeats 5

With ``--repeats N`` the arms run N times on the same Ray instance, in the given order and
then reversed, alternately (the first arm of a run is at a small disadvantage: Ray's worker
pool and the allocator start); each repetition's ratios are printed, and their median and
range, since one run's ratio moves by more than the gaps being measured on a shared
machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import iqr_text, machine_description, markdown_table  # noqa: E402
import _tune_common as tc  # noqa: E402

LOG = logging.getLogger("many_trials")

SAMPLES = 2000
EPOCHS = 3
BATCH = 64


def _process_started_at() -> float:
    """Wall-clock time this process was created (Linux ``/proc``; NaN elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _data_and_model(seed: int) -> tuple:
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2))
    return torch.utils.data.TensorDataset(x, y), model


def train_plain(config: dict) -> None:
    """The work of one trial in plain torch (the ``fifo`` arm)."""
    marks = {"proc_created": _process_started_at(), "fn_start": time.time()}
    import torch
    torch.set_num_threads(1)
    data, model = _data_and_model(config["seed"])
    marks["joined"] = time.time()
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(EPOCHS):
        _train_epoch(epoch, loader, model, opt, marks)


def _train_epoch(epoch: int, loader, model, opt, marks: dict) -> None:
    """One epoch of the arms' common training step, then one report with the marks."""
    import torch
    from ray import tune
    correct = 0
    for x, y in loader:
        opt.zero_grad()
        out = model(x)
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
        marks.setdefault("first_step", time.time())
        correct += int((out.argmax(1) == y).sum())
    marks.setdefault("first_report", time.time())
    tune.report({"epoch": epoch, "accuracy": correct / SAMPLES, "pid": os.getpid(),
                 **{f"t_{k}": v for k, v in marks.items()}})


def train_adaptdl(config: dict) -> None:
    """The same work with adaptdl_core (the ``adaptdl`` arms)."""
    marks = {"proc_created": _process_started_at(), "fn_start": time.time()}
    import torch

    import adaptdl_core.torch as adl
    data, model = _data_and_model(config["seed"])
    adl.init_process_group("gloo")
    marks["joined"] = time.time()
    loader = adl.AdaptiveDataLoader(data, batch_size=BATCH, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = adl.AdaptiveDataParallel(model, opt)
    for epoch in adl.remaining_epochs_until(EPOCHS):
        _train_epoch(epoch, loader, model, opt, marks)


def _recorder() -> Any:
    from ray import tune

    class Recorder(tune.Callback):
        """Per trial: first seen (pending), start, end, status and its first result."""

        def __init__(self) -> None:
            self.trials: dict[str, dict[str, Any]] = {}

        def _rec(self, trial: Any) -> dict[str, Any]:
            return self.trials.setdefault(trial.trial_id, {
                "seen": time.time(), "start": None, "end": None, "status": None,
                "first": None})

        def on_step_begin(self, iteration, trials, **info):
            for trial in trials:
                self._rec(trial)

        def on_trial_start(self, iteration, trials, trial, **info):
            rec = self._rec(trial)
            if rec["start"] is None:
                rec["start"] = time.time()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            rec = self._rec(trial)
            if rec["first"] is None:
                rec["first"] = {k: v for k, v in result.items()
                                if k.startswith("t_") or k in ("pid", "adaptdl/launch_s")}

        def _ended(self, trial: Any, status: str) -> None:
            rec = self._rec(trial)
            rec["end"], rec["status"] = time.time(), status

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._ended(trial, "TERMINATED")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._ended(trial, "ERROR")

    return Recorder()


def _warm_up_trial(config: dict) -> None:
    import torch  # noqa: F401 - the import is the work
    from ray import tune
    tune.report({"done_warming": 1})


def warm_up(cpus: int, storage: str) -> float:
    """One plain trial per CPU, not measured (see the module docstring); seconds taken."""
    from ray import tune
    t0 = time.time()
    tune.Tuner(_warm_up_trial, param_space={"i": tune.grid_search(list(range(cpus)))},
               run_config=tune.RunConfig(name="warm-up", storage_path=storage,
                                         verbose=0)).fit()
    return time.time() - t0


def run_arm(arm: str, trials: int, storage: str) -> dict[str, Any]:
    """One arm on the running Ray instance; raw per-trial records and totals."""
    import ray
    from ray import tune

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    recorder = _recorder()
    space = {"seed": tune.grid_search(list(range(trials)))}
    if arm in ("fifo", "fifo-reuse"):
        trainable, scheduler, reuse = train_plain, None, arm == "fifo-reuse"
    elif arm in ("adaptdl", "adaptdl-noreuse"):
        trainable = AdaptDLTrainableCreator(train_adaptdl, min_replicas=1, max_replicas=1)
        scheduler, reuse = AdaptDLScheduler(), arm == "adaptdl"
    else:
        raise ValueError(f"unknown arm {arm!r}: use fifo, fifo-reuse, adaptdl or "
                         "adaptdl-noreuse")
    t0 = time.time()
    tuner = tune.Tuner(trainable, param_space=space,
                       tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=reuse),
                       run_config=tune.RunConfig(name=arm, storage_path=storage, verbose=0,
                                                 callbacks=[recorder]))
    grid = tuner.fit()
    wall = time.time() - t0
    time.sleep(1.0)  # placement groups of the last trials are removed asynchronously
    left = [pg for pg in ray.util.placement_group_table().values()
            if pg.get("state") != "REMOVED"]
    return {"arm": arm, "wall_s": wall, "errors": len(grid.errors), "t0": t0,
            "trials": list(recorder.trials.values()), "placement_groups_left": len(left),
            "reuse_actors": reuse}


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def summarize(arm: dict[str, Any]) -> dict[str, Any]:
    """Figures of one arm from its raw records."""
    done = [t for t in arm["trials"] if t["start"] is not None and t["end"] is not None]
    firsts = [t["first"] for t in done if t["first"]]
    pids = [f["pid"] for f in firsts]
    reused = len(pids) - len(set(pids))

    def phase(a: str, b: str) -> float:
        return _median([max(f[f"t_{b}"] - f[f"t_{a}"], 0.0) for f in firsts
                        if f"t_{a}" in f and f"t_{b}" in f])

    first_of_pid: dict[Any, dict] = {}
    for f in firsts:  # a process's creation is the cost of the first trial it served
        if "t_fn_start" in f and (f.get("pid") not in first_of_pid or
                                  f["t_fn_start"] < first_of_pid[f["pid"]]["t_fn_start"]):
            first_of_pid[f.get("pid")] = f
    breakdown = {
        "process created -> function start": _median(
            [max(f["t_fn_start"] - f["t_proc_created"], 0.0) for f in first_of_pid.values()]),
        "function start -> joined (data, model, process group)": phase("fn_start", "joined"),
        "joined -> first step": phase("joined", "first_step"),
        "first step -> first report": phase("first_step", "first_report"),
    }
    launches = [f["adaptdl/launch_s"] for f in firsts if f.get("adaptdl/launch_s")]
    return {
        "arm": arm["arm"], "trials": len(arm["trials"]), "finished": len(done),
        "errors": arm["errors"], "wall_s": arm["wall_s"],
        "run_s": [t["end"] - t["start"] for t in done],
        "life_s": [t["end"] - t["seen"] for t in done],
        "longest_wait_s": max((t["start"] - t["seen"] for t in done), default=float("nan")),
        "reused_processes": reused, "placement_groups_left": arm["placement_groups_left"],
        "breakdown_s": breakdown,
        "launch_to_first_step_s": _median(launches),
    }


_PLAIN_OF = {"adaptdl": "fifo-reuse", "adaptdl-noreuse": "fifo"}


def ratios(arms: list[dict[str, Any]]) -> dict[str, float]:
    """AdaptDL arm -> its wall over the plain arm's of the same ``reuse_actors``, for the
    pairs present in ``arms`` (one repetition)."""
    walls = {a["arm"]: a["wall_s"] for a in arms}
    return {arm: walls[arm] / walls[plain] for arm, plain in _PLAIN_OF.items()
            if arm in walls and plain in walls}


def repeats_report(data: dict[str, Any]) -> str:
    """The ratio of each repetition, and their median and range."""
    runs: dict[int, list] = {}
    for arm in data["arms"]:
        runs.setdefault(arm.get("repeat", 0), []).append(arm)
    per = {i: ratios(arms) for i, arms in sorted(runs.items())}
    pairs = sorted({k for r in per.values() for k in r})
    rows = [[str(i + 1), " then ".join(a["arm"] for a in runs[i])] +
            [f"{per[i][k]:.3f}x" if k in per[i] else "-" for k in pairs] for i in per]
    rows.append(["median [min, max]", ""] + [
        f"{statistics.median(v):.3f}x [{min(v):.3f}, {max(v):.3f}]"
        for v in ([per[i][k] for i in per if k in per[i]] for k in pairs)])
    return markdown_table(["repetition", "order"] + [f"{k} / {_PLAIN_OF[k]} wall"
                                                      for k in pairs], rows)


def report(data: dict[str, Any]) -> str:
    if data.get("repeats", 1) > 1:
        first = dict(data, arms=[a for a in data["arms"] if a.get("repeat", 0) == 0])
        return report(dict(first, repeats=1)) + "\n\nOver the repetitions:\n\n" + \
            repeats_report(data)
    sums = [summarize(a) for a in data["arms"]]
    by_arm = {s["arm"]: s for s in sums}
    reuse_of = {a["arm"]: a["reuse_actors"] for a in data["arms"]}

    def versus_plain(s: dict[str, Any]) -> str:
        base = by_arm.get(_PLAIN_OF.get(s["arm"], ""))
        return f"{s['wall_s'] / base['wall_s']:.2f}x" if base else "-"

    header = ["arm", "reuse_actors", "trials done", "wall s", "wall / plain (same reuse)",
              "run s: median [p25, p75]", "pending-to-end s: median", "longest wait s",
              "reused processes", "placement groups left"]
    rows = [[s["arm"], str(reuse_of[s["arm"]]), f"{s['finished']}/{s['trials']}",
             f"{s['wall_s']:.1f}", versus_plain(s),
             iqr_text(s["run_s"], "{:.2f}"), f"{_median(s['life_s']):.1f}",
             f"{s['longest_wait_s']:.1f}",
             str(s["reused_processes"]), str(s["placement_groups_left"])] for s in sums]
    phases = list(sums[0]["breakdown_s"])
    brows = [[p] + [f"{s['breakdown_s'][p]:.2f}" for s in sums] for p in phases]
    brows.append(["AdaptDL trial launch (setup) -> first step"] +
                 [f"{s['launch_to_first_step_s']:.2f}" for s in sums])
    return "\n".join([
        f"Machine: {data['machine']}; Ray CPUs {data['cpus']}, {data['trials']} trials per "
        f"arm, {EPOCHS} epochs of a small MLP on {SAMPLES} samples each", "",
        markdown_table(header, rows), "",
        "run: Tune's on_trial_start (after the trial actor's setup) to the trial's end; "
        "pending-to-end and wait: from the trial first seen pending.", "",
        "Where a trial's first seconds go (median s; process creation only for trials that "
        "started a new process):", "",
        markdown_table(["phase"] + [s["arm"] for s in sums], brows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=100, help="trials per arm (default 100)")
    p.add_argument("--quick", action="store_true", help="20 trials per arm")
    p.add_argument("--arms", default="adaptdl-noreuse,fifo,fifo-reuse,adaptdl",
                   help="comma-separated, run in this order: fifo, fifo-reuse, adaptdl, "
                        "adaptdl-noreuse (default adaptdl-noreuse,fifo,fifo-reuse,adaptdl)")
    p.add_argument("--cpus", type=int, default=8, help="Ray CPUs (default 8)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the arms this many times, alternating their order (default 1)")
    tc.add_output_arguments(p, "many_trials.json")
    args = p.parse_args(argv)
    if tc.start_cli(args, report):
        return 0
    trials = 20 if args.quick else args.trials
    if trials < 1:
        raise SystemExit("--trials must be >= 1")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    import ray
    tc.init_ray(args.cpus)
    storage = tempfile.mkdtemp(prefix="many-trials-")
    data: dict[str, Any] = {"machine": machine_description(), "cpus": args.cpus,
                            "trials": trials, "arms": [], "repeats": args.repeats}
    LOG.info("warm-up (not measured): %.1f s", warm_up(args.cpus, storage))
    for repeat in range(args.repeats):
        for arm in (arms if repeat % 2 == 0 else arms[::-1]):
            LOG.info("arm %s: %d trials", arm, trials)
            data["arms"].append(dict(run_arm(arm, trials, storage), repeat=repeat))
            LOG.info("arm %s: %.1f s", arm, data["arms"][-1]["wall_s"])
    ray.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "many_trials_quick.json" if args.quick else "many_trials.json"
    with open(out / name, "w") as f:
        json.dump(data, f)
    print(report(data))
    print(f"raw data: {out / name}")
    ok = all(a["errors"] == 0 and a["placement_groups_left"] == 0 for a in data["arms"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
