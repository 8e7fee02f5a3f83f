"""Time to a target test accuracy: autoscaled batch size versus fixed batch sizes.

The task is the digits example (``examples/digits_data.py``: the 10k-parameter digits
CNN, 1437 training and 360 test images), trained as ``examples/standalone_digits.py``
does: one process, ``torch.set_num_threads(1)``, SGD (lr 0.05, momentum 0.9, tuned for
batch 64) with a cosine LR schedule over the epoch budget, ``AdaptiveDataParallel`` and
an ``AdaptiveDataLoader``. The arms differ only in the batch size:

* ``fixed-B`` for B in 16 .. 512: ``AdaptiveDataLoader(batch_size=B)``, nothing else; the
  lr stays 0.05 (the user only changes the batch size). AdaScale never rescales it: the
  rule's scale is ``current_batch_size / batch_size`` = 1 for a fixed loader, and
  ``gain(1) == 1`` (see ``AdaptiveDataParallel._step`` and ``GradientNoiseScale.gain``).
* ``auto-16`` (the arm the targets are judged on): ``batch_size=16``, the smallest size
  of the sweep, plus ``loader.autoscale_batch_size(MAX_BATCH, local_bsz_bounds=(None,
  MAX_BATCH))``: the loader may grow the batch from 16 up to ``MAX_BATCH``, the lr (0.05
  at batch 16) follows AdaScale, and an epoch lasts until the statistical progress of
  one pass at batch 16. No lower bound (this CNN has no BatchNorm), so the sampled steps
  that measure the gradient noise split a batch of 16 into two halves of 8; an arm
  ``auto-16/lo16`` (``--arms``) sets the lower bound 16 instead, which makes those steps
  take two whole batches (a step at 32). Autoscaling never goes below the initial batch (as in Pollux,
  the efficiency of a batch is at most 1 relative to it), so only an arm that starts at
  the smallest size can reach every fixed size it is compared with.
* ``auto-64``: the same from ``batch_size=64`` (the batch the lr was tuned for): what a
  user who starts larger gets. It cannot reach 16 or 32; the report judges it too.
* ``auto-B/exact`` and ``auto-B/exact-now`` (``--arms``; diagnostics): ``auto-B`` with the
  library's noise measurement replaced by the exact one. At every step where the library
  measures (the same sampled steps, which still cost what they cost), the exact ``|G|^2``
  and ``tr(Sigma)`` at the current weights are computed from per-sample gradients over the
  whole training set (the clock paused meanwhile) and fed to the library's estimator as
  the values its two half-batches would give on average: ``/exact`` through its usual
  smoothing, ``/exact-now`` replacing the estimate outright (no smoothing, no lag). They
  separate what the noise estimate costs from what the goodput model itself decides.

All arms use ``drop_last=False`` (the example uses True): with ``drop_last=True`` an
autoscaled loader never ends its epoch once fewer samples than one batch are left in the
pass before the epoch's progress target is reached (it looped forever without yielding,
fixed since in commit 0798e8d), so the last, partial batch of each pass is kept everywhere
(the published numbers were measured so).

Why ``MAX_BATCH = 256``: the training set has 1437 images, so a batch of 512 is a third of
it (three steps per pass, the last one partial); 256 still gives 6 steps per pass and is 4x
``auto-64``'s initial batch, enough room for the goodput model to act on. ``--max-batch-size 512``
runs the other choice.

Every arm is a subprocess (``--worker``; ``init_process_group`` may be called once per
process), for several seeds (the seed of the model initialisation; all arms of a seed
share it). The arms of a seed run side by side in turns of 10 ms (``_sliced``: each
stops itself once set up, then the runner resumes one at a time, round-robin), so that
they meet the same slow and fast phases of the shared machine; each arm's training clock
is its own CPU time (which, with one thread and the core to itself, is its wall time).
The clock runs from the start of the epoch loop and is paused while the worker
snapshots the weights (every 5 ms of training and at every epoch end; a copy of 10k
parameters), so the evaluation -- done on the snapshots after training -- costs no
training time and does not disturb the loader's step-time profile. Reported per arm: the
training time at which the test accuracy first reaches 0.95 and 0.97 (to 5 ms), the
final accuracy after the epoch budget, and the samples and time the budget took.

Usage: ``python benchmarks/autobsz.py [--quick] [--seeds N] [--epochs E]
[--max-batch-size M] [--arms A,B,...] [--json PATH]`` (arms: ``fixed-B``, ``auto-B``,
``auto-B/loL``, ``auto-B/exact``, ``auto-B/exact-now``) (default: 5 seeds x 8 arms x 30 epochs, about 9
minutes on a 2-core machine; ``--quick``: 3 seeds x 6 arms x 15 epochs, about 2
minutes).
Targets: auto no slower than 1.05 x the best fixed size, final accuracy within 1 point.

``--gns-check ARM`` (a few seconds) prints, instead, the library's gradient-noise-scale
estimate next to the exact one (per-sample gradients over the training set) along one
run of ARM (``fixed-64``, ``auto-64``, ...): the diagnostic behind the README's analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import _sliced  # noqa: E402

TARGETS = (0.95, 0.97)
AUTO = "auto-16"           # the arm the targets are judged on (see the docstring)
AUTO_ARMS = (AUTO, "auto-64")
INIT_BATCH = 64
LR = 0.05
MOMENTUM = 0.9
MAX_BATCH = 256
SNAP_EVERY_S = 0.005       # training seconds between weight snapshots (the resolution)
TIME_TARGET = 1.05         # auto <= 1.05 x best fixed time to target
ACC_TARGET = 0.01          # auto final accuracy >= best fixed - 1 point

FIXED = {False: (16, 32, 64, 128, 256, 512), True: (16, 64, 256, 512)}
SEEDS = {False: 5, True: 3}
EPOCHS = {False: 30, True: 15}


# ----------------------------------------------------------------------------- worker
def parse_arm(arm: str) -> tuple[bool, int, int | None, set[str]]:
    """``(autoscaled, initial batch size, lower local bound or None, modifiers)`` of an
    arm name: ``fixed-B``, ``auto-B``, optionally followed (auto arms only) by ``/loL``
    (lower local bound L), ``/exact`` or ``/exact-now`` (see the module docstring).

    Raises:
        ValueError: for any other name, saying which forms are accepted.
    """
    name, *modifiers = arm.split("/")
    kind, _, size = name.partition("-")
    low = None
    ok = kind in ("fixed", "auto") and size.isdigit() and int(size) > 0 \
        and (kind == "auto" or not modifiers)
    for m in modifiers:
        if m.startswith("lo") and m[2:].isdigit() and int(m[2:]) > 0:
            low = int(m[2:])
        elif m not in ("exact", "exact-now"):
            ok = False
    if not ok:
        raise ValueError(f"bad arm {arm!r}: use fixed-B or auto-B[/loL][/exact|/exact-now] "
                         "(B, L positive integers), e.g. auto-16/exact")
    return kind == "auto", int(size), low, set(modifiers)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(_common.ROOT / "examples"))
    from digits_data import DigitsCNN, load_digits_datasets

    import adaptdl_core.torch as adl

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    adl.init_process_group("gloo")
    train, test = load_digits_datasets()
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    ddp = adl.AdaptiveDataParallel(model, optimizer, scheduler)
    auto, batch, low, modifiers = parse_arm(args.arm)
    loader = adl.AdaptiveDataLoader(train, batch_size=batch,
                                    shuffle=True, drop_last=False)  # see the docstring
    if auto:
        loader.autoscale_batch_size(args.max_batch_size,
                                    local_bsz_bounds=(low, args.max_batch_size))

    snaps = []          # (train seconds, samples, steps, epoch, batch size, weights)
    bsz_samples = {}    # batch size -> training samples used at it
    lr_factors = []     # (steps, AdaScale lr factor) when it changes
    paused = 0.0
    samples = steps = 0
    clock = _sliced.clock
    next_snap = 0.0

    if modifiers & {"exact", "exact-now"}:
        from adaptdl_core.torch.gradient_noise_scale import GradientNoiseScale

        measured_update = GradientNoiseScale.update
        # exact-now: the update carries 1e5 M0-steps of training, so the EMA forgets all
        # earlier measurements and holds this one alone (no smoothing, no lag).
        forget = "exact-now" in modifiers

        def exact_update(gns, local_sqr, total_sqr, num_grads, batch_size, elapsed=None):
            # The library's measurement (two halves of the batch) is discarded; what it
            # would average to is fed instead: halves of M/2 samples give E|g_half|^2 =
            # |G|^2 + 2 tr(Sigma) / M and E|mean|^2 = |G|^2 + tr(Sigma) / M.
            nonlocal paused
            t0 = clock()
            sqr, trace = exact_noise(model, train)
            paused += clock() - t0
            measured_update(gns, sqr + 2 * trace / batch_size, sqr + trace / batch_size, 2,
                            batch_size, 1e5 * gns.init_batch_size if forget else elapsed)

        GradientNoiseScale.update = exact_update

    def snapshot(epoch: int) -> None:
        nonlocal paused, next_snap
        t0 = clock()
        trained = t0 - start - paused
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        snaps.append((trained, samples, steps, epoch, loader.current_batch_size, weights))
        next_snap = trained + SNAP_EVERY_S
        paused += clock() - t0

    _sliced.wait_for_turn()  # the other arms of this seed run in turns with this one
    start = clock()
    snapshot(-1)
    for epoch in adl.remaining_epochs_until(args.epochs):
        model.train()
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(ddp(images), labels).backward()
            optimizer.step()
            n = len(labels)
            samples += n
            steps += 1
            bsz_samples[n] = bsz_samples.get(n, 0) + n
            factor = ddp.scaling_rule.last_lr_factor
            if not lr_factors or abs(lr_factors[-1][1] - factor) > 0.05 * lr_factors[-1][1]:
                lr_factors.append((steps, round(factor, 3)))
            if clock() - start - paused >= next_snap:
                snapshot(epoch)
        if snaps[-1][2] != steps:
            snapshot(epoch)
        scheduler.step()
    total = clock() - start - paused

    # Evaluation of the snapshots, after training.
    x, y = test.tensors
    evaluator = DigitsCNN()
    evaluator.eval()
    trace = []
    with torch.no_grad():
        for t, n, k, epoch, bsz, weights in snaps:
            evaluator.load_state_dict(weights)
            acc = float((evaluator(x).argmax(dim=1) == y).float().mean())
            trace.append([round(t, 4), n, k, epoch, bsz, round(acc, 4)])
    _common.emit_result({
        "trace": trace, "train_s": total, "samples": samples, "steps": steps,
        "final_acc": trace[-1][5], "bsz_samples": bsz_samples, "lr_factors": lr_factors[:50],
        "gns": repr(ddp.gns)})


# ----------------------------------------------------------------------------- parent
def time_to(trace: list, target: float) -> float:
    for t, _n, _k, _e, _b, acc in trace:
        if acc >= target:
            return t
    return math.inf


def fmt_time(values: list[float]) -> str:
    reached = [v for v in values if math.isfinite(v)]
    if len(reached) < len(values) / 2:
        return f"not reached ({len(reached)}/{len(values)})"
    # the median over all seeds (unreached counts as infinite), with the spread
    med = _common.median(values)
    lo, hi = _common.quantile(values, 0.25), _common.quantile(values, 0.75)
    note = "" if len(reached) == len(values) else f", {len(reached)}/{len(values)} reached"
    return f"{med:.2f} [{lo:.2f}, {hi:.2f}]{note}".replace("inf", "never")


def report(runs: dict, seeds: list[int], arms: list[str], epochs: int,
           max_batch: int) -> str:
    rows = []
    per_arm = {}
    for name in arms:
        res = [runs[(name, s)] for s in seeds]
        per_arm[name] = res
        bsz = {}
        for r in res:
            for k, v in r["bsz_samples"].items():
                bsz[int(k)] = bsz.get(int(k), 0) + v
        total = sum(bsz.values())
        mix = ", ".join(f"{k}: {100 * v / total:.0f}%" for k, v in sorted(bsz.items())
                        if v / total >= 0.01)
        rows.append([f"`{name}`"] + [fmt_time([time_to(r["trace"], t) for r in res])
                                      for t in TARGETS]
                    + [_common.iqr_text([r["final_acc"] for r in res], "{:.4f}"),
                       f"{_common.median([r['train_s'] for r in res]):.2f}",
                       f"{_common.median([r['samples'] for r in res]) / 1437:.1f}",
                       mix if name.startswith("auto") else name.split("-")[1]])
    table = _common.markdown_table(
        ["arm"] + [f"time to {t:.2f} (s): median [p25, p75]" for t in TARGETS]
        + ["final accuracy: median [p25, p75]", f"{epochs}-epoch time (s)",
           "passes over the data", "batch sizes (share of samples)"], rows)

    verdict = []
    fixed_names = [n for n in arms if n.startswith("fixed-")]
    for name in [n for n in arms if n.startswith("auto-")]:
        verdict += _verdict(name, per_arm, fixed_names, epochs)
    summary = _common.markdown_table(
        ["auto arm", "criterion", "best fixed arm (median)", "auto (median)",
         "ratio of medians", "per-seed ratio auto / best: median [p25, p75]", "target met?"],
        verdict)
    return (f"### Autoscaled (at most {max_batch}) versus fixed batch sizes: "
            f"{len(seeds)} seeds, {epochs} epochs (targets judged on `{AUTO}`)\n\n"
            + summary + "\n\n" + table)


def _verdict(name: str, per_arm: dict, fixed_names: list[str], epochs: int) -> list[list]:
    """Rows of the summary: auto arm ``name`` versus the best fixed arm, per target
    (time) and for the final accuracy."""
    verdict = []
    auto = per_arm[name]
    for t in TARGETS:
        med = {n: _common.median([time_to(r["trace"], t) for r in per_arm[n]])
               for n in fixed_names}
        best = min(med, key=med.get)
        auto_t = [time_to(r["trace"], t) for r in auto]
        best_t = [time_to(r["trace"], t) for r in per_arm[best]]
        ratio_med = _common.median(auto_t) / med[best] if math.isfinite(med[best]) else math.nan
        paired = [a / b for a, b in zip(auto_t, best_t) if math.isfinite(a) and math.isfinite(b)]
        verdict.append([f"`{name}`", f"time to {t:.2f}", f"`{best}` ({med[best]:.2f} s)",
                        f"{_common.median(auto_t):.2f} s",
                        f"{ratio_med:.3f}",
                        (_common.iqr_text(paired) + f" (n={len(paired)})") if paired else "-",
                        "yes" if ratio_med <= TIME_TARGET else
                        f"no ({100 * (ratio_med - TIME_TARGET):+.1f} pts over 1.05)"])
    accs = {n: _common.median([r["final_acc"] for r in per_arm[n]]) for n in fixed_names}
    best = max(accs, key=accs.get)
    auto_acc = _common.median([r["final_acc"] for r in auto])
    verdict.append([f"`{name}`", f"final accuracy after {epochs} epochs",
                    f"`{best}` ({accs[best]:.4f})",
                    f"{auto_acc:.4f}", f"{auto_acc - accs[best]:+.4f} (difference)", "",
                    "yes" if auto_acc >= accs[best] - ACC_TARGET else
                    f"no ({100 * (accs[best] - ACC_TARGET - auto_acc):.1f} pts short)"])
    return verdict


# ------------------------------------------------ exact noise (/exact arms, --gns-check)
def exact_noise(model, dataset) -> tuple[float, float]:
    """The exact ``|G|^2`` and ``tr(Sigma)`` (per-sample covariance) of ``model``'s
    cross-entropy gradient over the whole ``dataset`` (a ``TensorDataset``), from per-sample
    gradients (``torch.func``), in float64."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap

    xs, ys = dataset.tensors
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, xs, ys)
    flat = torch.cat([v.reshape(len(xs), -1) for v in g.values()], 1).double()
    mean = flat.mean(0)
    return float(mean.pow(2).sum()), float(((flat - mean) ** 2).sum(1).mean())


def gns_check(arm: str, seed: int, steps: int) -> None:
    """Print the library's gradient-noise estimate next to the exact one along a run.

    One process (so the library splits sampled steps' batches in two halves); at a few
    steps the
    exact ``|G|^2`` and ``tr(Sigma)`` over the whole training set are computed from
    per-sample gradients (``torch.func``), and the noise scale ``B = tr(Sigma) / |G|^2``
    compared with the library's ``gns.noise_scale()``.
    """
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(_common.ROOT / "examples"))
    from digits_data import DigitsCNN, load_digits_datasets

    import adaptdl_core.torch as adl

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    adl.init_process_group("gloo")
    train, _ = load_digits_datasets()
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ddp = adl.AdaptiveDataParallel(model, optimizer)
    batch = int(arm.split("-")[1])
    loader = adl.AdaptiveDataLoader(train, batch_size=batch, shuffle=True, drop_last=False)
    # A single replica measures the noise only when its batch size is adaptive; for a
    # fixed-B arm cap the batch at B: it stays fixed, the measurement runs.
    cap = MAX_BATCH if arm.startswith("auto-") else batch
    loader.autoscale_batch_size(cap, local_bsz_bounds=(None, cap))

    checks = {3, 5, 10, 20, 40, 80, 160, 320, 640}
    rows, step = [], 0
    for _epoch in adl.remaining_epochs_until(1000):
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(ddp(images), labels).backward()
            optimizer.step()
            step += 1
            if step in checks:
                sqr, trace = exact_noise(model, train)
                g = ddp.gns
                rows.append([step, loader.current_batch_size, f"{trace / sqr:.0f}",
                             f"{g.noise_scale():.0f}", f"{g.noise_scale() / (trace / sqr):.2f}",
                             f"{g.gain(MAX_BATCH / batch):.2f}"])
            if step >= steps:
                break
        if step >= steps:
            break
    print(f"### Gradient noise scale, `{arm}`, seed {seed}: library (1 replica, "
          f"half-batch pairs on sampled steps) vs exact over the training set\n")
    print(_common.markdown_table(
        ["step", "batch", "exact B = tr(Sigma)/|G|^2", "library noise_scale()",
         "library / exact", f"library gain({MAX_BATCH}/{batch})"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 seeds, 5 arms, 15 epochs")
    p.add_argument("--seeds", type=int, help="number of seeds (default 5; quick 3)")
    p.add_argument("--epochs", type=int, help="epoch budget (default 30; quick 15)")
    p.add_argument("--max-batch-size", type=int, default=MAX_BATCH,
                   help=f"the auto arm's max_batch_size (default {MAX_BATCH})")
    p.add_argument("--arms", help="comma-separated arms instead of the default set "
                   "(auto-B, auto-B/loL with lower local bound L, auto-B/exact and "
                   "auto-B/exact-now with the exact noise scale, fixed-B)")
    p.add_argument("--json", help="also write every run's trace here")
    p.add_argument("--from-json", metavar="PATH",
                   help="print the tables of a run saved with --json, without measuring")
    p.add_argument("--gns-check", metavar="ARM",
                   help="instead: print the library's noise-scale estimate vs the exact one "
                        "along one run of ARM (e.g. fixed-64 or auto-64; seconds)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--worker-gns", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.epochs is None:
        args.epochs = EPOCHS[args.quick]
    if args.worker_gns:
        gns_check(args.worker_gns, seed=0, steps=320)
        return
    if args.worker:
        worker(args)
        return
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        runs = {(k.split("/seed")[0], int(k.split("/seed")[1])): v
                for k, v in saved["runs"].items()}
        seeds = sorted({s for _, s in runs})
        arms = list(dict.fromkeys(a for a, _ in sorted(runs, key=lambda k: (
            not k[0].startswith("auto"), k[0].startswith("auto-16"),
            int(k[0].split("-")[1]) if k[0].startswith("fixed") else 0))))
        print(f"Machine: {saved['machine']}\n\nCommand: {saved['command']}\n")
        print(report(runs, seeds, arms, saved["epochs"], saved["max_batch_size"]))
        return
    if args.gns_check:
        out = _common.launch_job(Path(__file__).resolve(), ["--worker-gns", args.gns_check],
                             replicas=1, timeout=600)
        print(out[0][1])
        return
    seeds = list(range(args.seeds if args.seeds else SEEDS[args.quick]))
    arms = args.arms.split(",") if args.arms else \
        list(AUTO_ARMS) + [f"fixed-{b}" for b in FIXED[args.quick]]
    for arm in arms:
        try:
            parse_arm(arm)
        except ValueError as e:
            p.error(f"--arms: {e}")
    machine = _common.machine_description()
    started = time.perf_counter()
    runs = {}
    for seed in seeds:
        # All arms of a seed at once, in turns of _sliced.SLICE_S, in a random order.
        order = list(arms)
        random.Random(1000 + seed).shuffle(order)
        commands = {arm: [sys.executable, str(Path(__file__).resolve()), "--worker",
                          "--arm", arm, "--seed", str(seed), "--epochs", str(args.epochs),
                          "--max-batch-size", str(args.max_batch_size)] for arm in order}
        envs = {arm: _common.child_env() for arm in order}
        for arm, (status, text) in _sliced.run_sliced(commands, envs,
                                                      cwd=str(_common.ROOT)).items():
            if status != 0:
                raise RuntimeError(f"{arm} seed {seed} exited {status}:\n{text[-3000:]}")
            res = _common.parse_result(text)
            runs[(arm, seed)] = res
            print(f"# seed {seed} {arm}: {res['train_s']:.2f} s, final "
                  f"{res['final_acc']:.4f}, to 0.97: {time_to(res['trace'], 0.97):.2f} s",
                  file=sys.stderr, flush=True)
    total = time.perf_counter() - started
    cmd = "python benchmarks/autobsz.py" + (" --quick" if args.quick else "")
    if args.seeds:
        cmd += f" --seeds {args.seeds}"
    if args.epochs != EPOCHS[args.quick]:
        cmd += f" --epochs {args.epochs}"
    if args.max_batch_size != MAX_BATCH:
        cmd += f" --max-batch-size {args.max_batch_size}"
    if args.arms:
        cmd += f" --arms {args.arms}"
    print(f"Machine: {machine}\n")
    print(f"Command: {cmd} (total {total:.0f} s)\n")
    print(report(runs, seeds, arms, args.epochs, args.max_batch_size))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "command": f"{cmd} (total {total:.0f} s)",
                       "epochs": args.epochs, "max_batch_size": args.max_batch_size,
                       "runs": {f"{k[0]}/seed{k[1]}": v for k, v in runs.items()}}, f)


if __name__ == "__main__":
    main()
