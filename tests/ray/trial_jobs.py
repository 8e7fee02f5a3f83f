"""Training functions run by the Ray Tune tests (imported by the worker actors).

``counting_job`` trains a tiny linear model on items that carry their own index and
appends what every replica sees to ``config["record_dir"]`` (one JSON line per event):
the sample indices of each batch with the epoch, replica count and restart number, so a
test can check that every epoch saw every sample exactly once across resizes.
"""

from __future__ import annotations

import glob
import json
import os
import time

import torch
from ray import tune

import adaptdl_core.env as env
import adaptdl_core.torch as adl
from adaptdl_core import checkpoint


class IndexedData(torch.utils.data.Dataset):
    """``size`` items ``(index, x, y)`` of a noisy linear regression."""

    def __init__(self, size: int):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, 2, generator=g)
        self.y = self.x @ torch.tensor([1.0, -1.0]) + 0.1 * torch.randn(size, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def _start(config: dict) -> tuple:
    """Join the job; ``(rank, restarts, replicas, record file, loader over IndexedData)``."""
    torch.manual_seed(0)
    adl.init_process_group("gloo")
    rank, restarts, replicas = env.replica_rank(), env.num_restarts(), env.num_replicas()
    record_dir = config["record_dir"]
    if config.get("per_trial_records"):  # several trials share the record_dir
        record_dir = os.path.join(record_dir, tune.get_context().get_trial_id())
        os.makedirs(record_dir, exist_ok=True)
    path = os.path.join(record_dir, f"restart{restarts}-rank{rank}.jsonl")
    log = open(path, "a", buffering=1)
    loader = adl.AdaptiveDataLoader(IndexedData(config["size"]),
                                    batch_size=config["batch_size"], shuffle=True)
    return rank, restarts, replicas, log, loader


def _train_batch(model, opt, x, y, config: dict) -> torch.Tensor:
    """One optimizer step of the linear regression, then ``config["sleep"]`` seconds plus
    ``config["sleep_per_sample"]`` per sample of this replica's batch (a step time that
    shrinks with more replicas, as a real model's would, without using the CPUs)."""
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    loss.backward()
    opt.step()
    if not (config.get("slow_until") and os.path.exists(config["slow_until"])):
        time.sleep(config.get("sleep", 0.0) + config.get("sleep_per_sample", 0.0) * len(x))
    return loss


def counting_job(config: dict) -> None:
    """Config: ``record_dir``, ``epochs``, ``size``, ``batch_size``, ``sleep`` (seconds per
    batch), ``report_every`` (batches between reports), optional ``autoscale`` (max batch),
    ``sleep_per_sample`` (seconds per sample of a replica's batch), ``slow_until`` (a
    path: once it exists, batches no longer sleep), ``per_trial_records`` (records
    under ``record_dir/<trial id>``) and ``record_node`` (start records carry the Ray
    node id the replica runs on)."""
    rank, restarts, replicas, log, loader = _start(config)
    if config.get("autoscale"):
        loader.autoscale_batch_size(config["autoscale"], local_bsz_bounds=(2, 64))
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(net, opt)
    start = {"event": "start", "replicas": replicas, "restarts": restarts,
             "nodes": env.num_nodes(), "epoch": adl.current_epoch(),
             "trial_id": tune.get_context().get_trial_id()}
    if config.get("record_node"):
        import ray
        start["node"] = ray.get_runtime_context().get_node_id()
    log.write(json.dumps(start) + "\n")
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        # A restart at the very end of an epoch resumes with no batch left in it.
        loss = torch.tensor(float("nan"))
        for step, (idx, x, y) in enumerate(loader):
            at = loader.current_index  # (its pass: an autoscaled epoch may take several)
            loss = _train_batch(model, opt, x, y, config)
            log.write(json.dumps({"event": "batch", "epoch": epoch, "idx": idx.tolist(),
                                  "replicas": replicas, "restarts": restarts, "time": time.time(),
                                  "pass": at // config["size"]}) + "\n")
            if (step + 1) % config.get("report_every", 5) == 0:
                tune.report({"epoch": epoch, "loss": loss.item(),
                             "report_key": f"{epoch}:{loader.current_index}"})
        tune.report({"epoch": epoch, "loss": loss.item(), "report_key": f"{epoch}:end"})
    log.write(json.dumps({"event": "finished"}) + "\n")


# Two small seeded jobs that differ in seed and model size (for :func:`seeded_job`).
SEEDED_BASE = {"epochs": 2, "size": 64, "batch_size": 8}
SEEDED_CASES = [{"seed": 1, "hidden": 3}, {"seed": 2, "hidden": 5}]


class ResultsBySeed(tune.Callback):
    """Every result as the driver received it, by the trial's ``config["case"]["seed"]``."""

    def __init__(self):
        self.by_seed = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.by_seed.setdefault(trial.config["case"]["seed"], []).append(dict(result))


def contract_job(config: dict) -> None:
    """A job that exercises the Tune contracts; config as for :func:`counting_job`, plus:

    ``user_checkpoint`` (report ``model.pt`` with every epoch's report), ``fail_at``
    (``[epoch, batch]``: rank 0 raises there, or at the first batch after it once the job
    has a checkpoint, once; the markers live in ``record_dir``; ``after_checkpoint:
    False`` drops the wait for a checkpoint) and ``exit_at`` (the same, but the process of
    rank ``exit_rank``, by default the last, dies with ``os._exit(1)``).
    Keys under ``config["case"]`` override the others (one grid-search value per trial).
    Every epoch reports ``epoch``, ``loss``, ``neg_loss``, ``weights`` (the model's
    parameters as floats) and ``report_key``; the start event records what
    ``tune.get_context()`` says on each replica."""
    import tempfile

    config = {**config, **config.get("case", {})}
    rank, restarts, replicas, log, loader = _start(config)
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(net, opt)
    ctx = tune.get_context()
    log.write(json.dumps({
        "event": "start", "replicas": replicas, "restarts": restarts,
        "finished_epochs": adl.finished_epochs(),
        "trial_id": ctx.get_trial_id(), "trial_name": ctx.get_trial_name(),
        "trial_dir": ctx.get_trial_dir(), "world_rank": ctx.get_world_rank(),
        "world_size": ctx.get_world_size(), "local_rank": ctx.get_local_rank(),
        "local_world_size": ctx.get_local_world_size(), "node_rank": ctx.get_node_rank(),
        "resumed_from": sorted(os.listdir(tune.get_checkpoint().path))
        if tune.get_checkpoint() else None}) + "\n")
    marker = os.path.join(config["record_dir"], "failed-once")
    saved = os.path.join(config["record_dir"], "checkpointed")
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        loss = torch.tensor(float("nan"))
        for step, (idx, x, y) in enumerate(loader):
            if rank == 0 and checkpoint.latest_checkpoint_dir() is not None:
                open(saved, "a").close()  # the trial has a checkpoint to retry from
            ready = os.path.exists(saved) or not config.get("after_checkpoint", True)
            if not os.path.exists(marker) and ready:
                if config.get("fail_at") and [epoch, step] >= config["fail_at"] and rank == 0:
                    open(marker, "w").close()
                    raise RuntimeError(f"planned failure at epoch {epoch} batch {step}")
                if config.get("exit_at") and [epoch, step] >= config["exit_at"] and \
                        rank == config.get("exit_rank", replicas - 1):
                    open(marker, "w").close()
                    os._exit(1)
            loss = _train_batch(model, opt, x, y, config)
            log.write(json.dumps({"event": "batch", "epoch": epoch, "idx": idx.tolist(),
                                  "replicas": replicas, "restarts": restarts,
                                  "time": time.time()}) + "\n")
        metrics = {"epoch": epoch, "loss": loss.item(), "neg_loss": -loss.item(),
                   "weights": [p.item() for p in net.parameters() for p in p.flatten()],
                   "report_key": f"{epoch}:end"}
        if config.get("user_checkpoint"):
            with tempfile.TemporaryDirectory() as d:
                torch.save(net.state_dict(), os.path.join(d, "model.pt"))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)
        log.write(json.dumps({"event": "report", "key": f"{epoch}:end",
                              "time": time.time()}) + "\n")
    log.write(json.dumps({"event": "finished"}) + "\n")


def seeded_job(config: dict) -> None:
    """A small MLP (``config["hidden"]`` units, seed ``config["seed"]``) trained for
    ``config["epochs"]`` epochs on ``config["size"]`` items; each epoch reports the loss and
    the model's parameters, with what the process carried in from before the job: its pid,
    the States already registered and the ``ADAPTDL_*`` variables other than the job's
    (``pid``, which Tune overwrites with the trial actor's, is also sent as ``fn_pid``).
    ``fail_at_epoch``: raise at the start of that epoch.
    Keys under ``config["case"]`` override the others."""
    from adaptdl_core import context

    config = {**config, **config.get("case", {})}
    inherited_states = context.current().states.names()
    job_vars = {"ADAPTDL_CHECKPOINT_PATH", "ADAPTDL_JOB_ID", "ADAPTDL_MASTER_ADDR",
                "ADAPTDL_MASTER_PORT", "ADAPTDL_NUM_NODES", "ADAPTDL_NUM_REPLICAS",
                "ADAPTDL_NUM_RESTARTS", "ADAPTDL_REPLICA_RANK", "ADAPTDL_TIMEOUT"}
    stray_vars = sorted(k for k in os.environ if k.startswith("ADAPTDL_") and k not in job_vars)
    torch.manual_seed(config["seed"])
    adl.init_process_group("gloo")
    os.environ["ADAPTDL_SEEDED_JOB_WAS_HERE"] = "1"  # a stray variable the next job must not see
    loader = adl.AdaptiveDataLoader(IndexedData(config["size"]),
                                    batch_size=config["batch_size"], shuffle=True)
    net = torch.nn.Sequential(torch.nn.Linear(2, config["hidden"]), torch.nn.Tanh(),
                              torch.nn.Linear(config["hidden"], 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(net, opt)
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        if epoch == config.get("fail_at_epoch"):
            raise RuntimeError(f"planned failure at epoch {epoch}")
        loss = torch.tensor(float("nan"))
        for _, x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            opt.step()
        tune.report({"epoch": epoch, "loss": loss.item(),
                     "weights": [v.item() for p in net.parameters() for v in p.flatten()],
                     "pid": os.getpid(), "fn_pid": os.getpid(),
                     "inherited_states": inherited_states,
                     "stray_vars": stray_vars})


def validating_job(config: dict) -> None:
    """The shape of a user's first sweep, as it once broke the interrupt: each short
    epoch trains with ``autoscale_batch_size``, runs a validation loop over a second
    ``AdaptiveDataLoader``, reports ``model.pt`` as a Tune checkpoint, then sleeps
    ``config["pause"]`` seconds. Config as for :func:`counting_job` (``record_dir``,
    ``epochs``, ``size``, ``batch_size``, ``sleep``) plus ``val_size``, ``pause`` and
    ``start_together`` (a first launch waits for the sweep's other trials to start:
    :func:`_wait_for_siblings`).
    Records ``start`` (with ``finished_epochs``), ``batch`` and ``report`` events, and
    ``held`` when the harness holds it in the pause (:func:`_held`)."""
    import tempfile

    rank, restarts, replicas, log, loader = _start(config)
    loader.autoscale_batch_size(4 * config["batch_size"], local_bsz_bounds=(2, 32))
    val = adl.AdaptiveDataLoader(IndexedData(config["val_size"]),
                                 batch_size=config["batch_size"])
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(net, opt)
    log.write(json.dumps({"event": "start", "replicas": replicas, "restarts": restarts,
                          "finished_epochs": adl.finished_epochs()}) + "\n")
    if config.get("start_together") and restarts == 0:
        _wait_for_siblings(config["record_dir"])
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        model.train()
        for idx, x, y in loader:
            _train_batch(model, opt, x, y, config)
            log.write(json.dumps({"event": "batch", "epoch": epoch, "idx": idx.tolist(),
                                  "replicas": replicas, "restarts": restarts,
                                  "pass": loader.current_index // config["size"]}) + "\n")
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for _, x, y in val:
                total += torch.nn.functional.mse_loss(
                    model(x).squeeze(1), y, reduction="sum").item()
                count += len(y)
        metrics = {"epoch": epoch, "val_loss": total / max(count, 1),
                   "report_key": f"{epoch}:end"}
        with tempfile.TemporaryDirectory() as d:
            torch.save(net.state_dict(), os.path.join(d, "model.pt"))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        log.write(json.dumps({"event": "report", "key": f"{epoch}:end", "epoch": epoch,
                              "restarts": restarts, "time": time.time()}) + "\n")
        if not _held(config, epoch, restarts, log):
            time.sleep(config.get("pause", 0.0))
    log.write(json.dumps({"event": "finished"}) + "\n")


def _wait_for_siblings(record_dir: str, timeout_s: float = 120) -> None:
    """Wait until every record directory beside ``record_dir`` (one per trial of the
    sweep) holds a first launch's records: the trials then train side by side, so that on
    a loaded machine none runs to its end while another is still starting (it would have
    nothing left for the harness to interrupt). Gives up after ``timeout_s``."""
    root = os.path.dirname(os.path.abspath(record_dir))
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        dirs = [d for d in glob.glob(os.path.join(root, "*")) if os.path.isdir(d)]
        if all(os.path.exists(os.path.join(d, "restart0-rank0.jsonl")) for d in dirs):
            return
        time.sleep(0.02)


def _held(config: dict, epoch: int, restarts: int, log) -> bool:
    """Hold in the pause after ``epoch``'s report while the harness asks for it: while a
    file ``hold-from-epoch`` beside the record directory exists and names an epoch at most
    ``epoch``. Records a ``held`` event first, so that the harness can interrupt the trial
    while it is known to be in the pause; gives up after 120 s. Returns whether it held."""
    path = os.path.join(os.path.dirname(os.path.abspath(config["record_dir"])),
                        "hold-from-epoch")
    try:
        with open(path) as f:
            first = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    if epoch < first:
        return False
    log.write(json.dumps({"event": "held", "epoch": epoch, "restarts": restarts,
                          "time": time.time()}) + "\n")
    deadline = time.time() + 120
    while os.path.exists(path) and time.time() < deadline:
        time.sleep(0.02)
    return True


def _rebuild_poison(origin_pid: int, pickled_by: int) -> "PoisonOnSecondHop":
    here = os.getpid()
    if here != origin_pid and pickled_by not in (origin_pid, here):
        raise RuntimeError("planned unpickling failure on a replica")
    return PoisonOnSecondHop(origin_pid)


class PoisonOnSecondHop:
    """A config value that unpickles in the driver and where the driver sends it (the
    trial actor) but not one hop further (a replica worker, which gets it from the trial
    actor): the replica's ``run`` then fails before the training function begins."""

    def __init__(self, origin_pid: int | None = None):
        self.origin_pid = os.getpid() if origin_pid is None else origin_pid

    def __reduce__(self):
        return _rebuild_poison, (self.origin_pid, os.getpid())

    def __deepcopy__(self, memo):
        return self  # (Tune deep-copies the config in the trial actor: not a hop)
