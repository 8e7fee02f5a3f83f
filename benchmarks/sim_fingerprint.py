"""Deterministic outputs of small simulator runs, to show a refactor changes no result.

Runs small cluster simulations (every policy, the decision core and the direct Pollux path,
interference, ``max_time``, a timeline) and small sweep arms (static, adaptive, adaptive +
ASHA, unshared profiles, a static arm whose agents choose their batch), drops what is
wall-clock time (``wall_s``, decision-time figures), and writes the rest as JSON. Run it
before and after a change and compare::

    flock /tmp/heavy.lock nice -n 5 python benchmarks/sim_fingerprint.py --out /tmp/before.json
    ... change ...
    flock /tmp/heavy.lock nice -n 5 python benchmarks/sim_fingerprint.py --out /tmp/after.json \
        --compare /tmp/before.json

``--compare`` prints every path whose value differs (exact equality, floats included) and
exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptdl_core.sim.cluster import simulate  # noqa: E402
from adaptdl_core.sim.sweep import run_sweep, simulate_arm  # noqa: E402
from tests.sim.workloads import contended_rows, small_rows  # noqa: E402

#: Keys holding wall-clock measurements, not results.
TIMING_KEYS = {"wall_s", "decision_s"}


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def cases():
    """(name, thunk) of every run, each small enough for a shared 2-core machine."""
    small, contended = small_rows(), contended_rows()
    return [
        ("cluster/tiresias/load-0.5/workload-3",
         lambda: simulate("load-0.5/workload-3", "tiresias")),
        ("cluster/optimus/load-0.5/workload-5",
         lambda: simulate("load-0.5/workload-5", "optimus")),
        ("cluster/pollux/load-0.5/workload-1",
         lambda: simulate("load-0.5/workload-1", "pollux")),
        ("cluster/adaptdl/load-1.0/workload-1",
         lambda: simulate("load-1.0/workload-1", "adaptdl")),
        ("cluster/pollux/small", lambda: simulate(small, "pollux", nodes=4, timeline=True)),
        ("cluster/pollux-direct/small",
         lambda: simulate(small, "pollux", nodes=4, use_core=False)),
        ("cluster/tiresias/small", lambda: simulate(small, "tiresias", nodes=4)),
        ("cluster/pollux/contended", lambda: simulate(contended, "pollux", nodes=2)),
        ("cluster/adaptdl/contended", lambda: simulate(contended, "adaptdl", nodes=2)),
        ("cluster/adaptdl/max_time",
         lambda: simulate(contended[:3], "adaptdl", nodes=1, policy_options={"alpha": 0.0},
                          max_time=600.0)),
        ("cluster/pollux/interference",
         lambda: simulate(contended[:8], "pollux", nodes=2, gpus_per_node=2,
                          interference=0.25, interval=90.0)),
        ("cluster/optimus/interference",
         lambda: simulate(contended, "optimus", nodes=2, interference=0.25)),
        ("sweep/abc", lambda: run_sweep(trials=8, epochs=8, seed=3)),
        ("sweep/b-unshared",
         lambda: simulate_arm("b", trials=2, concurrent=1, epochs=6, share_profiles=False)),
        ("sweep/b-shared", lambda: simulate_arm("b", trials=2, concurrent=1, epochs=6)),
        ("sweep/a-adaptive-batch",
         lambda: simulate_arm("a", trials=4, concurrent=2, epochs=5, static_batch=None,
                              gpus_per_trial=3, tick_s=7.0)),
    ]


def _diff(a, b, path=""):
    if type(a) is not type(b):
        yield path, a, b
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                yield f"{path}/{k}", a.get(k, "<missing>"), b.get(k, "<missing>")
            else:
                yield from _diff(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            yield f"{path} (length)", len(a), len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="write the fingerprint JSON here")
    ap.add_argument("--compare", help="a fingerprint JSON to compare with (exit 1 on a "
                    "difference)")
    ap.add_argument("--only", nargs="+", help="run only the cases whose name starts so")
    args = ap.parse_args(argv)
    out = {}
    for name, thunk in cases():
        if args.only and not any(name.startswith(p) for p in args.only):
            continue
        t0 = time.perf_counter()
        out[name] = _strip(json.loads(json.dumps(thunk())))
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if not args.compare:
        return 0
    ref = json.loads(Path(args.compare).read_text())
    ref = {k: v for k, v in ref.items() if k in out}
    diffs = list(_diff(ref, out))
    for path, a, b in diffs[:50]:
        print(f"DIFF {path}: {a!r} -> {b!r}")
    print(f"{len(out)} cases compared with {args.compare}: "
          + ("identical" if not diffs else f"{len(diffs)} differences"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
