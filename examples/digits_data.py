"""Data and model for the digits examples (scikit-learn's bundled 8x8 handwritten digits).

Shared by ``standalone_digits.py`` and the Ray Tune example. Nothing is downloaded: the
1797 images ship with scikit-learn.

    from digits_data import DigitsCNN, evaluate, load_digits_datasets, train_epoch
    from digits_data import train_digits     # the Ray Tune trial function (benchmarks/)

    train_dataset, test_dataset = load_digits_datasets()
    model = DigitsCNN()
    logits = model(train_dataset[0][0].unsqueeze(0))   # shape (1, 10)
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

log = logging.getLogger(__name__)

__all__ = ["load_digits_datasets", "DigitsCNN", "NUM_CLASSES", "train_epoch", "evaluate",
           "train_digits"]

NUM_CLASSES = 10


def load_digits_datasets(test_fraction: float = 0.2,
                         seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Split scikit-learn's digits into a training and a test set.

    The split is stratified by class and depends only on ``seed``, so every replica and
    every restart of a job sees the same two sets. Pixels (0..16 in the raw data) are
    scaled to [0, 1] and then standardised with the mean and standard deviation of the
    *training* pixels.

    Arguments:
        test_fraction: share of the 1797 images held out for testing, in (0, 1)
            (0.2 gives 1437 training and 360 test images).
        seed: seed of the split.

    Returns:
        ``(train_dataset, test_dataset)``: :class:`~torch.utils.data.TensorDataset` s of
        ``(image, label)`` pairs, with float32 images shaped ``(1, 8, 8)`` and int64
        labels in ``0..9``.

    Raises:
        ValueError: if ``test_fraction`` is not strictly between 0 and 1.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"load_digits_datasets(test_fraction={test_fraction!r}): "
                         "must be strictly between 0 and 1")
    # Imported here so that importing this module (e.g. for DigitsCNN) stays cheap.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(torch.arange(len(labels)).numpy(),
                                           test_size=test_fraction, random_state=seed,
                                           stratify=labels.numpy())
    train_x, test_x = images[train_idx], images[test_idx]
    mean, std = train_x.mean(), train_x.std()
    return (TensorDataset((train_x - mean) / std, labels[train_idx]),
            TensorDataset((test_x - mean) / std, labels[test_idx]))


class DigitsCNN(torch.nn.Module):
    """A small CNN for 1x8x8 digit images (about 10k parameters; fast on one CPU core).

    Two 3x3 convolutions (16 and 32 channels, ReLU), a 2x2 max-pool down to 4x4, and a
    linear layer to the class logits.

    Arguments:
        num_classes: number of output logits.

    Shape:
        input ``(N, 1, 8, 8)`` float; output ``(N, num_classes)`` logits.
    """

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, kernel_size=3, padding=1),   # 16 x 8 x 8
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, kernel_size=3, padding=1),  # 32 x 8 x 8
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),                              # 32 x 4 x 4
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                loader: Iterable, accum: Any, log_every: int = 0, epoch: int = 0) -> None:
    """One pass of ``loader``: cross-entropy, backward (gradients are averaged over the
    replicas there), optimizer step. Adds ``train_loss`` (summed over samples) and
    ``train_n`` to ``accum`` (an ``adl.Accumulator``); logs the loss every ``log_every``
    batches when it is > 0 (as "epoch E step S/N loss L")."""
    model.train()
    for step, (images, labels) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        accum["train_loss"] += loss.item() * len(labels)
        accum["train_n"] += len(labels)
        if log_every and step % log_every == 0:
            log.info("epoch %d step %d/%d loss %.4f", epoch, step, len(loader), loss.item())


def evaluate(model: torch.nn.Module, loader: Iterable, accum: Any) -> None:
    """Count correct predictions on ``loader`` (an AdaptiveDataLoader) into
    ``accum["correct"]`` and ``accum["test_n"]`` (read them inside
    ``accum.synchronized()``: the whole test set on any number of replicas)."""
    import adaptdl_core.torch as adl

    model.eval()
    with torch.no_grad():
        for batch in loader:
            # Without the repeats that pad a replica's last batch: the sums over all
            # replicas then cover the test set exactly once (adl.drop_padding).
            images, labels = adl.drop_padding(batch)
            accum["correct"] += (model(images).argmax(dim=1) == labels).sum().item()
            accum["test_n"] += len(labels)


def train_digits(config: dict) -> None:
    """One trial: ``lr``, ``momentum``, ``batch_size`` (initial global batch), ``epochs``,
    ``seed``, ``max_batch_size`` (autoscaling cap; 0 or missing: fixed batch) and
    ``report_every`` (epochs between test evaluations and reports, default 1; the last
    epoch always reports). The Ray Tune benchmarks in ``benchmarks/`` run it."""
    import time

    from ray import tune

    import adaptdl_core.torch as adl
    from adaptdl_core import checkpoint, env

    torch.manual_seed(config["seed"])

    adl.init_process_group("gloo")
    replicas = env.num_replicas()

    train_dataset, test_dataset = load_digits_datasets()
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"],
                                momentum=config["momentum"])
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                              T_max=config["epochs"])
    model = adl.AdaptiveDataParallel(model, optimizer, lr_scheduler)

    # batch_size is the initial global batch: the loader moves it (up to max_batch_size)
    # to wherever the measured throughput and gradient noise predict the best goodput.
    train_loader = adl.AdaptiveDataLoader(train_dataset, batch_size=config["batch_size"],
                                          shuffle=True, drop_last=True)
    if config.get("max_batch_size"):
        train_loader.autoscale_batch_size(config["max_batch_size"])
    test_loader = adl.AdaptiveDataLoader(test_dataset, batch_size=256)
    accum = adl.Accumulator()
    every = max(1, int(config.get("report_every", 1)))

    if checkpoint.latest_checkpoint_dir() is not None:
        log.info("resuming at epoch %d on %d replica(s) (restart %d)",
                 adl.finished_epochs(), replicas, env.num_restarts())

    start = time.perf_counter()
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        train_epoch(model, optimizer, train_loader, accum)
        if (epoch + 1) % every == 0 or epoch == config["epochs"] - 1:
            evaluate(model, test_loader, accum)
            with accum.synchronized():
                train_loss = accum["train_loss"] / max(accum["train_n"], 1)
                accuracy = accum["correct"] / accum["test_n"]
                accum.clear()
            log.info("epoch %d: train loss %.4f, test accuracy %.4f, lr %.4f (%.1f s)",
                     epoch, train_loss, accuracy, lr_scheduler.get_last_lr()[0],
                     time.perf_counter() - start)
            # The one addition: hand the epoch's metrics to Tune (the adaptdl/ metrics are
            # added). A resize requested now takes effect at the next batch boundary.
            tune.report({"mean_accuracy": accuracy, "train_loss": train_loss, "epoch": epoch})

        # As in standalone_digits.py: step the scheduler at the END of the epoch body.
        lr_scheduler.step()
