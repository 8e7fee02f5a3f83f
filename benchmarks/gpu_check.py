"""GPU check: adaptdl_core on the nccl path of one GPU, and its per-step cost there.

Two parts, each measured in child processes (``init_process_group`` may be called once
per process); everything is generated on the fly (no downloads, no scikit-learn).

**Part a: the nccl path works, end to end** (``adl.init_process_group("nccl")`` with the
``ADAPTDL_*`` variables of a one-replica job on a free port). A small CNN (three 3x3
convolutions with BatchNorm, 114k parameters at the default width) learns a synthetic
10-class task on 3x32x32 inputs (class templates, smooth random patterns, plus Gaussian
noise and 10% label noise; the tensors live on the device and a batch is one
``index_select``) with ``AdaptiveDataParallel`` + ``AdaptiveDataLoader`` and SGD. Three
*modes*, each run as a checkpoint-restart round trip of four processes:

=============  ====================================================================
mode           what runs
=============  ====================================================================
``fixed``      fixed global batch, no dropout
``autoscale``  ``loader.autoscale_batch_size(max)``: the gradient noise is measured (on
               one replica from the two halves of sampled steps), the batch size is
               re-decided from goodput, the lr follows AdaScale
``augment``    ``fixed`` plus a random horizontal flip of each batch, decided by
               ``torch.rand(())`` on the CPU (torch's global CPU generator, which the
               checkpoint saves and restores)
``dropout``    ``fixed`` with a dropout layer (on a GPU it draws from the *device's*
               generator; on the CPU from the CPU one)
=============  ====================================================================

* run 1 (checkpoint dir, ``ADAPTDL_NUM_RESTARTS=0``) calls
  ``adl.request_checkpoint_and_exit()`` in the middle of epoch 1; it must exit with
  status 143 after writing a checkpoint;
* run 2 (same dir, ``ADAPTDL_NUM_RESTARTS=1``) resumes from it and trains to the end;
* run 3 (a fresh dir) trains the same epochs uninterrupted, same seed;
* run 4 (a fresh dir) is run 3 again: the control, how reproducible an uninterrupted run
  is at all on this device.

All four use deterministic settings (``torch.use_deterministic_algorithms(True)``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, cuDNN deterministic, no cuDNN benchmark; the loss is
cross-entropy written as ``-(log_softmax * one_hot).sum(1).mean()`` with the one-hot
matrix from a comparison: CUDA's NLLLoss has no deterministic implementation). Reported
per mode: whether run 2's final weights (parameters *and* buffers) are bitwise equal to
run 3's, and if not the largest absolute difference and the relative L2 distance; the
same for run 4 against run 3. To tell where a difference comes from, runs 2-4 also
record a fingerprint (hash) of the CPU and CUDA generator states at the resume point
(run 2: its first batch; runs 3 and 4: the same batch of epoch 1). Batch-size decisions
follow measured step times, so in ``autoscale`` mode two uninterrupted runs may differ already
(the control shows by how much). The ``autoscale`` run 3 is also the training check:
per epoch the test accuracy, ``adaptdl_core.torch.status.training_status()`` (batch
size, gain, noise scale, goodput, efficiency, progress) and ``model.gns`` (number of
noise updates, ``sqr_avg``, ``var_avg``), what the library's throughput model sees (its
step-time profile per local batch size and its predicted samples/s at the current batch)
and the share of samples trained at each batch size.

**Part b: per-step overhead against plain DDP** (one process per model and variant,
nccl, one replica). Arms, side by side in one process on the same model, data, batch and
optimizer (SGD, momentum 0.9):

=============  ====================================================================
arm            what runs
=============  ====================================================================
``bare``       the module itself + torch ``DataLoader``: no DDP at all (a floor)
``ddp``        ``torch.nn.parallel.DistributedDataParallel`` (nccl) + ``DataLoader``:
               the baseline
``adp``        ``AdaptiveDataParallel`` + ``AdaptiveDataLoader``; variant ``fixed``:
               fixed batch; variant ``auto``:
               ``autoscale_batch_size(max_batch_size=batch)`` (the cap keeps the
               batch, so the compute, equal to the baseline's; noise measured on
               sampled steps, which on one replica run as two half batches; step
               profiling, throughput refits, goodput decisions, AdaScale)
=============  ====================================================================

Only one adaptive loader may be the training loader of a process (it owns the job's
statistical progress), hence one process per variant, each with its own ``bare`` and
``ddp`` arms. A round runs every arm for one trial in a random order: ``skip`` steps
(iterator start), ``torch.cuda.synchronize()``, ``steps`` timed steps,
``torch.cuda.synchronize()``; the first ``warmup`` rounds are not counted. A trial's
value is its time per ``batch`` samples (an optimizer step of the baseline: a sampled
step of ``auto``, two micro-batches of half the batch, counts as one). Ratios are per
round (paired) and reported as the median with a distribution-free 95% confidence
interval of the median (order statistics; ``_common.median_ci``). After the rounds, one
more trial of ``ddp`` and ``adp`` runs under ``cProfile`` (Python time per step; the part
spent in ``adaptdl_core``) and one under ``torch.profiler`` (GPU kernel time per step).
The library's own step-time profile of the ``adp`` arm (what its throughput model sees,
measured without synchronising) is reported next to the synchronised time.

Models: ``resnet18`` (the CIFAR ResNet-18: 3x3 stem, 4 stages of 2 basic blocks, 11.2M
parameters; batch 256 of 3x32x32 in fp32 takes several milliseconds on an H100, so the
GPU, not Python, sets the pace, as in real training) and ``smallcnn`` (part a's CNN at
batch 64: a step of tens of kernels, launch-bound, where any Python per step shows: the
worst case for a wrapper). cuDNN benchmark mode is on in part b (the first, warm-up,
rounds absorb its autotuning); TF32 settings are torch's defaults.

Usage::

    python benchmarks/gpu_check.py --json benchmarks/results/gpu_check.json   # GPU
    python benchmarks/gpu_check.py --device cpu --quick                       # debug

(``--device cpu`` uses gloo and tiny sizes with ``--quick``; ``--parts a`` or ``b`` runs
one part; ``--from-json PATH`` prints the tables of a saved run again.)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

SCRIPT = Path(__file__).resolve()
MODES = ("fixed", "autoscale", "augment", "dropout")
EXIT_CHECKPOINTED = 143
CLASSES = 10

# Part a sizes: (train samples, test samples, CNN width, epochs, batch, max batch), by
# (device kind, quick).
TRAIN_SIZES = {
    ("cuda", False): (16384, 2048, 32, 4, 64, 1024),
    ("cuda", True): (4096, 1024, 32, 2, 64, 512),
    ("cpu", False): (4096, 1024, 8, 3, 32, 256),
    ("cpu", True): (1024, 256, 8, 2, 32, 128),
}
# Part b: model -> (batch, steps per trial, rounds, warm-up rounds, width), by
# (device kind, quick).
OVERHEAD_SIZES = {
    ("cuda", False): {"resnet18": (256, 30, 40, 3, 64), "smallcnn": (64, 60, 40, 3, 32)},
    ("cuda", True): {"resnet18": (256, 20, 8, 2, 64), "smallcnn": (64, 30, 8, 2, 32)},
    ("cpu", False): {"resnet18": (32, 10, 12, 1, 8), "smallcnn": (32, 20, 12, 1, 8)},
    ("cpu", True): {"resnet18": (16, 6, 4, 1, 4), "smallcnn": (16, 8, 4, 1, 4)},
}
SKIP = 3          # steps of a trial before the clock starts (iterator creation)
VARIANTS = ("fixed", "auto")


# ----------------------------------------------------------------------------- models, data
def _build_small_cnn(width: int, dropout: float):
    """Part a's CNN: conv-BN-ReLU x3 (widths w, 2w, 4w; 2x2 max-pooling after each),
    flatten (4w x 4 x 4), optional dropout, linear. No adaptive pooling (its CUDA
    backward is not deterministic)."""
    import torch.nn as nn

    class SmallCNN(nn.Module):
        """Three conv-BN-ReLU-pool blocks, flatten, (dropout), linear classifier."""

        def __init__(self) -> None:
            super().__init__()
            w = width
            self.features = nn.Sequential(
                nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(2 * w, 4 * w, 3, padding=1, bias=False), nn.BatchNorm2d(4 * w),
                nn.ReLU(), nn.MaxPool2d(2))
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.fc = nn.Linear(4 * w * 16, CLASSES)

        def forward(self, x):
            """Logits of a batch of 3x32x32 images."""
            return self.fc(self.drop(self.features(x).flatten(1)))

    return SmallCNN()


def _build_resnet18(width: int):
    """The CIFAR ResNet-18 (3x3 stem, no max-pool; stages of widths w, 2w, 4w, 8w with two
    basic blocks each; global mean; linear). 11.2M parameters at width 64."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        """A basic residual block (two 3x3 conv-BN, projection shortcut when needed)."""

        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            """Residual output."""
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(out)) + self.short(x))

    class ResNet18(nn.Module):
        """Stem, four stages of two blocks, mean over space, linear."""

        def __init__(self) -> None:
            super().__init__()
            w = width
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(w), nn.ReLU())
            layers, cin = [], w
            for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
                for j in range(2):
                    layers.append(Block(cin, cout, 2 if (i > 0 and j == 0) else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, CLASSES)

        def forward(self, x):
            """Logits of a batch of 3x32x32 images."""
            return self.fc(self.layers(self.stem(x)).mean((2, 3)))

    return ResNet18()


def _make_data(n_train: int, n_test: int, seed: int = 1234):
    """Synthetic 10-class images (CPU tensors; the same on every device): per class a
    smooth random template (8x8 noise upsampled to 32x32), a sample is
    ``0.5 * template + N(0, 1)`` noise, and 10% of the labels are replaced at random.
    Returns ``(x_train, y_train, x_test, y_test)``."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(seed)
    templates = F.interpolate(torch.randn(CLASSES, 3, 8, 8, generator=g), size=32,
                              mode="bilinear", align_corners=False)

    def draw(n: int):
        y = torch.randint(CLASSES, (n,), generator=g)
        x = 0.5 * templates[y] + torch.randn(n, 3, 32, 32, generator=g)
        flip = torch.rand(n, generator=g) < 0.1
        y = torch.where(flip, torch.randint(CLASSES, (n,), generator=g), y)
        return x, y

    return (*draw(n_train), *draw(n_test))


class TensorBatches:
    """A map-style dataset over tensors that fetches a whole batch in one ``index_select``
    (DataLoader calls ``__getitems__`` with the batch's indices; use
    ``collate_fn=identity``): no per-sample Python, and the tensors may live on the GPU."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        import torch
        idx = torch.as_tensor(indices, dtype=torch.long).to(self.x.device, non_blocking=True)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


def identity(batch):
    """collate_fn for :class:`TensorBatches`: the batch is already stacked."""
    return batch


def _device_info(device: str) -> dict:
    """Versions and device facts, read in a worker (torch is imported there)."""
    import platform
    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    nccl=".".join(str(v) for v in v) if isinstance(
                        v := torch.cuda.nccl.version(), tuple) else str(v),
                    gpu=props.name, sms=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2 ** 30, 1),
                    capability=f"{props.major}.{props.minor}",
                    tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                    tf32_cudnn=torch.backends.cudnn.allow_tf32)
    return info


# ----------------------------------------------------------------------------- part a worker
def train_worker(args: argparse.Namespace) -> None:
    """One process of a part-a round trip: train ``args.mode`` for the epochs; with
    ``--stop-epoch/--stop-step`` ask for a checkpoint-and-exit there (status 143); save
    the final weights to ``--weights-out``; emit a JSON result line (also on exit)."""
    import torch
    import torch.nn.functional as F

    import adaptdl_core.torch as adl
    from adaptdl_core import env
    from adaptdl_core.torch import _metrics
    from adaptdl_core.torch.status import training_status

    cuda = args.device == "cuda"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(args.seed)
    adl.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    n_train, n_test, width, epochs, batch, max_batch = TRAIN_SIZES[(args.device, args.quick)]
    x, y, xt, yt = (t.to(device) for t in _make_data(n_train, n_test))
    model = _build_small_cnn(width, 0.3 if args.mode == "dropout" else 0.0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model = adl.AdaptiveDataParallel(model, optimizer, name="gpu-check")
    loader = adl.AdaptiveDataLoader(TensorBatches(x, y), batch_size=batch, shuffle=True,
                                    collate_fn=identity)
    if args.mode == "autoscale":
        loader.autoscale_batch_size(max_batch)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    classes = torch.arange(CLASSES, device=device)

    def test_accuracy() -> float:
        net = model.module
        net.eval()
        correct = torch.zeros((), dtype=torch.long, device=device)
        with torch.no_grad():
            for i in range(0, len(yt), 1024):
                correct += (net(xt[i:i + 1024]).argmax(1) == yt[i:i + 1024]).sum()
        net.train()
        return correct.item() / len(yt)

    def rng_fingerprint() -> dict:
        """Hashes of the CPU (and CUDA) generator states; also of the CPU state after one
        more draw of the kind a DataLoader iterator makes when it is created."""
        import hashlib

        def h(state) -> str:
            return hashlib.sha1(state.numpy().tobytes()).hexdigest()[:12]

        state = torch.get_rng_state()
        fp = {"cpu": h(state)}
        torch.empty((), dtype=torch.int64).random_()  # (DataLoader iterator's base seed)
        fp["cpu_after_one_draw"] = h(torch.get_rng_state())
        torch.set_rng_state(state)
        if cuda:
            fp["cuda"] = h(torch.cuda.get_rng_state())
        return fp

    def throughput_model() -> dict:
        """What the library's throughput model sees: its step-time profile (mean ms of
        the profiled optimizer steps per local batch size, and how many) and its
        prediction of samples/s at the current local batch."""
        m = _metrics.metrics()
        out = {"profile_ms": {k.split(",")[-1]: [round(1e3 * e["optim_t"] / e["optim_n"], 3),
                                                  e["optim_n"]]
                              for k, e in m.profile.items() if e["optim_n"]},
               "perf_params": list(m.perf_params) if m.perf_params else None}
        fn = _metrics.goodput_fn()
        if fn is not None:
            out["predicted_samples_per_s"] = float(fn.throughput(
                1, 1, loader.current_local_bsz, loader.accumulation_steps))
        return out

    def gns_dict() -> dict:
        """The noise estimator's state (number of updates, |G|^2, tr(Sigma)/M0, noise scale)."""
        gns = model.gns
        if gns is None:
            return {"num_updates": 0}
        return {"num_updates": gns.num_updates, "sqr_avg": gns.sqr_avg(),
                "var_avg": gns.var_avg(), "noise_scale": gns.noise_scale()}

    result: dict = {"mode": args.mode, "restarts": env.num_restarts(), "epochs": [],
                    "samples_by_batch": {}, "changes": [], "info": _device_info(args.device)}
    samples_by_batch = result["samples_by_batch"]
    first = None
    micro = 0
    started = time.perf_counter()
    try:
        for epoch in adl.remaining_epochs_until(epochs):
            loss_sum = torch.zeros((), device=device)
            seen = 0
            in_epoch = 0
            t_epoch = time.perf_counter()
            for xb, yb in loader:
                if first is None and env.num_restarts() > 0 and "rng_at_resume" not in result:
                    result["rng_at_resume"] = rng_fingerprint()
                if epoch == args.stop_epoch and in_epoch == args.rng_step and \
                        env.num_restarts() == 0:
                    result["rng_at_resume"] = rng_fingerprint()
                bsz = loader.current_batch_size
                if not result["changes"] or result["changes"][-1][2] != bsz:
                    result["changes"].append([epoch, micro, bsz])
                samples_by_batch[str(bsz)] = samples_by_batch.get(str(bsz), 0) + len(yb)
                if args.mode == "augment" and torch.rand(()) < 0.5:
                    xb = xb.flip(3)
                optimizer.zero_grad()
                logp = F.log_softmax(model(xb), 1)
                onehot = (yb[:, None] == classes).to(logp.dtype)
                loss = -(logp * onehot).sum(1).mean()
                loss.backward()
                optimizer.step()
                if first is None:  # the restored (or fresh) state after one step
                    first = {"epoch": epoch, "status": training_status(), "gns": gns_dict()}
                loss_sum += loss.detach() * len(yb)
                seen += len(yb)
                micro += 1
                in_epoch += 1
                if epoch == args.stop_epoch and in_epoch == args.stop_step:
                    result["stop_requested"] = {"epoch": epoch, "micro_batch": in_epoch,
                                                "status": training_status(),
                                                "gns": gns_dict()}
                    adl.request_checkpoint_and_exit()
            sync()
            result["epochs"].append({
                "epoch": epoch, "seconds": time.perf_counter() - t_epoch, "samples": seen,
                "micro_batches": in_epoch, "train_loss": loss_sum.item() / max(seen, 1),
                "test_accuracy": test_accuracy(), "status": training_status(),
                "gns": gns_dict(), "throughput_model": throughput_model()})
    except adl.CheckpointExit:
        # (What the checkpoint holds: it was written at the boundary after the request.)
        result.update(exited=EXIT_CHECKPOINTED, first=first, at_exit={
            "status": training_status(), "gns": gns_dict()},
            seconds=time.perf_counter() - started)
        _common.emit_result(result)
        raise
    result.update(first=first, seconds=time.perf_counter() - started,
                  final_status=training_status())
    if args.weights_out:
        torch.save({k: v.detach().cpu() for k, v in model.module.state_dict().items()},
                   args.weights_out)
    _common.emit_result(result)


# ----------------------------------------------------------------------------- part b worker
def overhead_worker(args: argparse.Namespace) -> None:
    """One part-b process: the ``bare``, ``ddp`` and ``adp`` arms of ``args.model`` in
    ``args.variant``, interleaved rounds, then cProfile and torch.profiler trials."""
    import cProfile
    import pstats

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    import adaptdl_core.torch as adl
    from adaptdl_core.torch import _metrics

    cuda = args.device == "cuda"
    torch.backends.cudnn.benchmark = cuda
    adl.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batch, steps, rounds, warmup, width = OVERHEAD_SIZES[(args.device, args.quick)][args.model]

    # The library refits its throughput model at most every REFIT_MIN_INTERVAL_S of wall
    # time; interleaved with two other arms it would see that clock run 3x faster than its
    # own training: give it a clock that runs only while the adp arm runs (as
    # step_overhead.py does), and count the fits.
    clock, fits = _common.isolate_library_clock(_metrics)

    # Enough samples for two trials in one epoch of the autoscaled loader (its epochs end
    # by statistical progress: one pass at the initial batch size).
    n = batch * (2 * (SKIP + steps) + 8)
    x, y, _, _ = _make_data(n, 0, seed=99)
    dataset = TensorBatches(x.to(device), y.to(device))

    def build():
        if args.model == "resnet18":
            return _build_resnet18(width).to(device)
        return _build_small_cnn(width, 0.0).to(device)

    torch.manual_seed(0)
    init = build().state_dict()
    arms: dict = {}
    arm_names = ("bare", "ddp", "adp")
    for arm in arm_names:
        model = build()
        model.load_state_dict(init)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if arm == "adp":
            wrapped = adl.AdaptiveDataParallel(model, optimizer, name="gpu-check-adp")
            loader = adl.AdaptiveDataLoader(dataset, batch_size=batch, shuffle=True,
                                            drop_last=True, collate_fn=identity)
            if args.variant == "auto":
                loader.autoscale_batch_size(batch)
        else:
            wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None) \
                if arm == "ddp" else model
            loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True,
                                collate_fn=identity)
        arms[arm] = (wrapped, optimizer, loader)
    params = sum(p.numel() for p in init.values() if p.is_floating_point())

    def trial(arm: str) -> float:
        """Seconds per ``batch`` samples over ``steps`` steps after ``SKIP`` (cut only at
        optimizer-step boundaries: a sampled step's two halves stay together)."""
        model, optimizer, loader = arms[arm]
        samples, t0, counted = 0, None, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            samples += len(yb)
            if samples % batch:
                continue  # the first half of a sampled step
            if t0 is None and samples >= SKIP * batch:
                sync()
                t0, counted = time.perf_counter(), samples
            elif t0 is not None and samples - counted >= steps * batch:
                break
        sync()
        assert t0 is not None and samples - counted >= steps * batch, "dataset too small"
        return (time.perf_counter() - t0) * batch / (samples - counted)

    results: dict[str, list[float]] = {arm: [] for arm in arm_names}
    profiles: dict = {}
    total = warmup + rounds + 1
    for r, _epoch in zip(range(total), adl.remaining_epochs_until(total)):
        if r < warmup + rounds:
            order = list(arm_names)
            random.Random(r).shuffle(order)
            for arm in order:
                t0 = time.monotonic()
                t = trial(arm)
                if arm != "adp":
                    clock.excluded += time.monotonic() - t0
                if r >= warmup:
                    results[arm].append(t)
            continue
        # The last epoch: where the time goes, for the baseline and our arm.
        for arm in ("ddp", "adp"):
            prof = cProfile.Profile()
            prof.enable()
            trial(arm)
            prof.disable()
            stats = pstats.Stats(prof)
            rows = []
            ours = 0.0
            for (fname, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
                if "adaptdl_core" in fname:
                    ours += tt
                rows.append((tt, ct, nc, f"{Path(fname).name}:{line}({func})"))
            rows.sort(reverse=True)
            # (A trial runs SKIP + steps steps, all profiled: per step = / (SKIP + steps).)
            entry = {"python_s_total": sum(r_[0] for r_ in rows),
                     "adaptdl_core_s": ours,
                     "top_tottime": [[round(1e3 * tt / (SKIP + steps), 4),
                                      round(1e3 * ct / (SKIP + steps), 4), nc, name]
                                     for tt, ct, nc, name in rows[:25]]}
            try:
                from torch.profiler import ProfilerActivity, profile
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                with profile(activities=acts) as tprof:
                    trial(arm)
                ka = tprof.key_averages()

                entry["torch_ops_by_cpu"] = ka.table(sort_by="self_cpu_time_total", row_limit=15)
                if cuda:
                    entry["torch_ops_by_gpu"] = ka.table(
                        sort_by="self_device_time_total" if hasattr(ka[0], "self_device_time_total")
                        else "self_cuda_time_total", row_limit=15)
            except Exception as exc:  # profiling is a diagnostic: never fail the run on it
                entry["torch_profiler_error"] = repr(exc)
            profiles[arm] = entry
    adp_loader = arms["adp"][2]
    adp_model = arms["adp"][0]
    lib_profile = {k: dict(v) for k, v in _metrics.metrics().profile.items()}
    _common.emit_result({
        "model": args.model, "variant": args.variant, "batch": batch, "steps": steps,
        "rounds": rounds, "warmup": warmup, "params": params, "step_s": results,
        "profiles": profiles, "library_profile": lib_profile,
        "adp_batch": adp_loader.current_batch_size,
        "gns_updates": adp_model.gns.num_updates if adp_model.gns is not None else 0,
        "fits": len(fits), "fit_ms": 1e3 * sum(fits) / max(len(fits), 1),
        "info": _device_info(args.device)})


# ----------------------------------------------------------------------------- parent
def _run_child(worker_args: list[str], extra_env: dict, timeout: float) -> tuple[int, str, float]:
    """Run this script as a one-replica job (free port, ``ADAPTDL_*``); returns (status,
    output, seconds)."""
    env = _common.child_env(extra=extra_env)
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), *worker_args], env=env,
                              cwd=str(_common.ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, time.perf_counter() - t
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
        return -9, out + f"\n[killed after {timeout} s]", time.perf_counter() - t


def _compare_weights(path_a: str, path_b: str) -> dict:
    """Bitwise equality of two saved state dicts; else the largest absolute difference
    and the relative L2 distance ``|a - b| / |b|`` over the floating-point tensors."""
    import torch
    a = torch.load(path_a, weights_only=True)
    b = torch.load(path_b, weights_only=True)
    if a.keys() != b.keys():
        return {"bitwise_equal": False, "error": "different keys"}
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    for k in a:
        if a[k].is_floating_point():
            d = (a[k].double() - b[k].double())
            max_abs = max(max_abs, d.abs().max().item() if d.numel() else 0.0)
            diff_sq += d.pow(2).sum().item()
            ref_sq += b[k].double().pow(2).sum().item()
    return {"bitwise_equal": not differing, "differing_tensors": len(differing),
            "tensors": len(a), "max_abs_diff": max_abs,
            "rel_l2": (diff_sq ** 0.5) / (ref_sq ** 0.5) if ref_sq else 0.0,
            "first_differing": differing[:5]}


def run_part_a(device: str, quick: bool, workdir: Path, log, on_progress=None,
               modes: tuple[str, ...] = MODES) -> dict:
    """The round trips (four processes per mode); returns their results (and hands
    them, as far as they got, to ``on_progress`` after every process)."""
    n_train, _, _, _, batch, _ = TRAIN_SIZES[(device, quick)]
    stop_step = (n_train // batch) // 2 + 3  # mid epoch 1, not on a round number
    out: dict = {"stop_epoch": 1, "stop_micro_batch": stop_step, "modes": {}}
    det_env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    for mode in modes:
        base = workdir / mode
        base.mkdir(parents=True, exist_ok=True)
        common = ["--worker", "train", "--device", device, "--mode", mode, "--seed", "0"] \
            + (["--quick"] if quick else [])
        runs = {}
        # (Runs 3 and 4 fingerprint the generators where run 2 resumes: at the start of the
        # batch after the one at which run 1 asked to stop.)
        at = ["--stop-epoch", "1", "--rng-step", str(stop_step)]
        plan = [("run1", "ckpt", 0, ["--stop-epoch", "1", "--stop-step", str(stop_step)]),
                ("run2", "ckpt", 1, []), ("run3", "ckpt3", 0, at), ("run4", "ckpt4", 0, at)]
        for name, ckpt, restarts, extra in plan:
            weights = str(base / f"{name}.pt")
            status, output, secs = _run_child(
                common + extra + ["--weights-out", weights],
                {**det_env, "ADAPTDL_CHECKPOINT_PATH": str(base / ckpt),
                 "ADAPTDL_NUM_RESTARTS": str(restarts)}, timeout=600)
            try:
                res = _common.parse_result(output)
            except RuntimeError:
                res = {}
            res.update(status=status, wall_s=secs, weights=weights)
            if status not in (0, EXIT_CHECKPOINTED):
                res["output_tail"] = output[-4000:]
            runs[name] = res
            log(f"# part a {mode} {name}: status {status} in {secs:.1f} s")
            if on_progress:
                on_progress({**out, "modes": {**out["modes"], mode: {"runs": runs}}})
        entry = {"runs": runs,
                 "run1_exit_ok": runs["run1"]["status"] == EXIT_CHECKPOINTED,
                 "checkpoint_written": (base / "ckpt").exists() and any((base / "ckpt").iterdir())}
        if all(runs[r]["status"] == 0 for r in ("run2", "run3", "run4")):
            entry["restart_vs_uninterrupted"] = _compare_weights(runs["run2"]["weights"],
                                                                 runs["run3"]["weights"])
            entry["control_vs_uninterrupted"] = _compare_weights(runs["run4"]["weights"],
                                                                 runs["run3"]["weights"])
        out["modes"][mode] = entry
    return out


def run_part_b(device: str, quick: bool, models: list[str], log, on_progress=None) -> list[dict]:
    """One process per (model, variant); returns their results (and hands them, as far
    as they got, to ``on_progress`` after every process)."""
    results = []
    for model in models:
        for variant in VARIANTS:
            args = ["--worker", "overhead", "--device", device, "--model", model,
                    "--variant", variant] + (["--quick"] if quick else [])
            status, output, secs = _run_child(args, {}, timeout=600)
            if status != 0:
                raise RuntimeError(f"part b {model}/{variant} exited {status}:\n{output[-4000:]}")
            res = _common.parse_result(output)
            res["wall_s"] = secs
            log(f"# part b {model}/{variant}: done in {secs:.0f} s")
            results.append(res)
            if on_progress:
                on_progress(results)
    return results


def _kernel_ms(table: str) -> float:
    """Total GPU kernel time (ms) of a profiled trial, from the footer ``Self CUDA time
    total: X`` of torch.profiler's table (summing the events' self device times instead
    counts a kernel under its operator and again as itself)."""
    import re
    m = re.search(r"Self (?:CUDA|device) time total:\s*([0-9.]+)\s*(us|ms|s)\b", table)
    if not m:
        return float("nan")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def _fmt_cmp(c: dict | None) -> str:
    if not c:
        return "n/a (a run failed)"
    if c["bitwise_equal"]:
        return f"**bitwise equal** ({c['tensors']} tensors)"
    return (f"differs: {c['differing_tensors']}/{c['tensors']} tensors, max abs. diff. "
            f"{c['max_abs_diff']:.3g}, rel. L2 {c['rel_l2']:.3g}")


def _info_of(saved: dict) -> dict | None:
    """The device facts a worker of the run reported (versions, GPU)."""
    if saved.get("part_b"):
        return saved["part_b"][0].get("info")
    for entry in (saved.get("part_a") or {}).get("modes", {}).values():
        for run in entry.get("runs", {}).values():
            if run.get("info"):
                return run["info"]
    return None


def report(saved: dict) -> str:
    """Markdown tables of a run (as saved with ``--json``)."""
    parts = []
    a = saved.get("part_a")
    if a:
        rows = []
        for mode, e in a["modes"].items():
            r1, r2, r3 = e["runs"]["run1"], e["runs"]["run2"], e["runs"]["run3"]
            stop = (r1.get("at_exit") or {}).get("status", {})
            first = (r2.get("first") or {}).get("status", {})
            rng2, rng3 = r2.get("rng_at_resume", {}), r3.get("rng_at_resume", {})
            rng = ", ".join(f"{k} {'same' if rng2.get(k) == rng3.get(k) else 'differs'}"
                            for k in ("cpu", "cuda") if k in rng3) or "?"
            if rng3 and rng2.get("cpu") != rng3.get("cpu"):
                rng += (" (run 2's CPU state = run 3's after one more draw: "
                        f"{'yes' if rng2.get('cpu') == rng3.get('cpu_after_one_draw') else 'no'})")
            rows.append([f"`{mode}`", f"{r1['status']} ({'ok' if e['run1_exit_ok'] else 'WRONG'})",
                         f"{stop.get('progress', float('nan')):.2f} / "
                         f"{first.get('progress', float('nan')):.2f}, batch "
                         f"{stop.get('batch_size', '?')} / {first.get('batch_size', '?')}, "
                         f"restarts {first.get('restarts', '?')}",
                         r2["status"], _fmt_cmp(e.get("restart_vs_uninterrupted")),
                         _fmt_cmp(e.get("control_vs_uninterrupted")), rng])
        parts.append(
            f"### Part a: checkpoint-restart round trips (stop requested at epoch "
            f"{a['stop_epoch']}, micro-batch {a['stop_micro_batch']})\n\n" + _common.markdown_table(
                ["mode", "run 1 exit",
                 "run 1 at exit / run 2 after its first batch: progress, batch, restarts",
                 "run 2 exit",
                 "run 2 (restarted) vs run 3 (uninterrupted)", "run 4 vs run 3 (control)",
                 "generator states at the resume point, run 2 vs run 3"], rows))
        run3 = a["modes"].get("autoscale", {}).get("runs", {}).get("run3", {})
        if run3.get("epochs"):
            rows = []
            for ep in run3["epochs"]:
                s, g = ep["status"], ep["gns"]
                rows.append([ep["epoch"], f"{ep['seconds']:.2f}", ep["samples"],
                             f"{ep['train_loss']:.3f}", f"{ep['test_accuracy']:.3f}",
                             s["batch_size"], f"{s['gain']:.2f}", f"{s['noise_scale']:.0f}",
                             f"{s['goodput']:.0f}", f"{s['efficiency']:.3f}",
                             f"{s['progress']:.0f}", g["num_updates"]])
            model_rows = []
            for ep in run3["epochs"]:
                tm = ep.get("throughput_model")
                if not tm:
                    continue
                prof = ", ".join(f"{b}: {ms:.2f} ms (n={n})" for b, (ms, n) in
                                 sorted(tm["profile_ms"].items(), key=lambda kv: int(kv[0])))
                pred = tm.get("predicted_samples_per_s")
                model_rows.append([ep["epoch"], ep["status"]["batch_size"],
                                   f"{ep['samples'] / ep['seconds']:.0f}",
                                   f"{pred:.0f}" if pred else "-", prof])
            if model_rows:
                parts.append(
                    "### Part a: the autoscaled run 3's throughput model at the epochs' ends\n\n"
                    + _common.markdown_table(
                        ["epoch", "batch", "measured samples/s (epoch)",
                         "model's samples/s at this batch", "library's step-time profile "
                         "(local batch: mean, n)"], model_rows))
            total = sum(run3["samples_by_batch"].values())
            share = ", ".join(f"{b}: {100 * c / total:.0f}%" for b, c in
                              sorted(run3["samples_by_batch"].items(), key=lambda kv: int(kv[0])))
            parts.append(
                "### Part a: the autoscaled run 3, per epoch (training_status() and "
                "model.gns at the epoch's end)\n\n" + _common.markdown_table(
                    ["epoch", "s", "samples", "train loss", "test acc", "batch", "gain",
                     "noise scale", "goodput/s", "efficiency", "progress", "gns updates"],
                    rows) + f"\n\nSamples by batch size: {share}. Batch size changes "
                f"(epoch, micro-batch, size): {run3['changes']}")
    b = saved.get("part_b")
    if b:
        rows = []
        for res in b:
            step = res["step_s"]
            base = step["ddp"]
            ratio = [x / y for x, y in zip(step["adp"], base)]
            over_bare = [x / y for x, y in zip(step["adp"], step["bare"])]
            olo, ohi = _common.median_ci(over_bare)
            bare = [x / y for x, y in zip(step["bare"], base)]
            lo, hi = _common.median_ci(ratio)
            blo, bhi = _common.median_ci(bare)
            prof = res.get("profiles", {})
            key = next(iter(res["library_profile"]), None)
            lib = res["library_profile"].get(key) if key else None
            lib_ms = (1e3 * lib["optim_t"] / lib["optim_n"] if lib and lib["optim_n"]
                      else float("nan"))
            per = res["steps"] + SKIP  # (profiled trials: every step, the skipped ones too)
            py = {arm: 1e3 * prof.get(arm, {}).get("python_s_total", float("nan")) / per
                  for arm in ("ddp", "adp")}
            ours = 1e3 * prof.get("adp", {}).get("adaptdl_core_s", float("nan")) / per
            gpu = {arm: _kernel_ms(prof.get(arm, {}).get("torch_ops_by_gpu", "")) / per
                   for arm in ("ddp", "adp")}
            gpu_text = (f"{gpu['ddp']:.2f} / {gpu['adp']:.2f}"
                        if res["info"].get("device") == "cuda" else "n/a (CPU)")
            rows.append([res["model"], f"{res['params'] / 1e6:.2f}M", res["batch"], res["variant"],
                         len(base), f"{1e3 * _common.median(step['bare']):.2f}",
                         f"{1e3 * _common.median(base):.2f}",
                         f"{1e3 * _common.median(step['adp']):.2f}",
                         f"**{_common.median(ratio):.3f}** [{lo:.3f}, {hi:.3f}]",
                         f"{_common.median(bare):.3f} [{blo:.3f}, {bhi:.3f}]",
                         f"{_common.median(over_bare):.3f} [{olo:.3f}, {ohi:.3f}]",
                         f"{lib_ms:.2f}", gpu_text,
                         f"{py['ddp']:.2f} / {py['adp']:.2f} ({ours:.2f})",
                         f"{res['gns_updates']}, {res['fits']}"])
        backend = "nccl" if b[0]["info"].get("device") == "cuda" else "gloo"
        parts.append(
            f"### Part b: time per step (per `batch` samples), one replica, {backend}; medians "
            "over rounds, ratios paired per round [95% CI of the median]\n\n"
            + _common.markdown_table(
                ["model", "params", "batch", "adp variant", "rounds", "bare ms", "ddp ms",
                 "adp ms", "adp / ddp", "bare / ddp", "adp / bare",
                 "library's own profile of adp, ms",
                 "GPU kernel ms/step ddp / adp (torch.profiler)",
                 "under cProfile: ms/step ddp / adp (own time in adaptdl_core)",
                 "noise updates, refits"], rows))
    return "\n\n".join(parts)


def main() -> None:
    """Parse the options; run the worker, or the parts, print tables, save JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (nccl; default) or cpu (gloo, for debugging the script)")
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    p.add_argument("--parts", default="a,b", help="which parts to run: a, b or a,b (default)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"part a modes, comma-separated (default {','.join(MODES)})")
    p.add_argument("--models", default="resnet18,smallcnn",
                   help="part b models, comma-separated (default resnet18,smallcnn)")
    p.add_argument("--json", metavar="PATH", help="write all raw results here")
    p.add_argument("--from-json", metavar="PATH", help="print the tables of a saved run")
    p.add_argument("--keep", action="store_true", help="keep part a's checkpoint directory")
    p.add_argument("--worker", choices=("train", "overhead"), help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop-epoch", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--stop-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--rng-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--weights-out", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=("resnet18", "smallcnn"), help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "train":
        train_worker(args)
        return
    if args.worker == "overhead":
        overhead_worker(args)
        return
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print(f"Command: {saved.get('command')}\n\nMachine: {saved.get('machine')}; "
              f"{saved.get('nvidia_smi', '')}; {_info_of(saved)}\n")
        if saved.get("partial"):
            print("(A progress save: the run did not reach its final write.)\n")
        print(report(saved))
        return
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    if not parts <= {"a", "b"} or not parts:
        p.error("--parts takes a, b or a,b")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not set(models) <= {"resnet18", "smallcnn"}:
        p.error("--models takes resnet18 and/or smallcnn")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or not set(modes) <= set(MODES):
        p.error(f"--modes takes some of {', '.join(MODES)}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.perf_counter()
    saved: dict = {"command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:]),
                   "machine": _common.machine_description()}
    if args.device == "cuda" and shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True)
        saved["nvidia_smi"] = q.stdout.strip()
    def save(key: str):
        """A progress callback: keep the part's results so far in ``saved`` and on disk
        (a run cut short still leaves what it measured)."""
        def on_progress(value) -> None:
            saved[key] = value
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                with open(args.json, "w") as f:
                    json.dump({**saved, "partial": True}, f, indent=1)
        return on_progress

    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    try:
        if "a" in parts:
            t = time.perf_counter()
            saved["part_a"] = run_part_a(args.device, args.quick, workdir, log, save("part_a"),
                                         modes)
            saved["part_a"]["wall_s"] = time.perf_counter() - t
        if "b" in parts:
            saved["part_b"] = run_part_b(args.device, args.quick, models, log, save("part_b"))
    finally:
        if args.keep:
            log(f"# part a files kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    saved["total_s"] = time.perf_counter() - started
    info = saved["device_info"] = _info_of(saved)
    print(f"Command: {saved['command']} (total {saved['total_s']:.0f} s)\n")
    print(f"Machine: {saved['machine']}; {saved.get('nvidia_smi', '')}; {info}\n")
    print(report(saved))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(saved, f, indent=1)


if __name__ == "__main__":
    main()
