"""Data and model of the HyperOpt example: sets of 8 vectors, classified by a shared MLP.

Each of the 20,000 synthetic samples is a set of 8 vectors of 64 features; the model runs
a 64-512-512 MLP on every vector, averages the 8 results and maps them to 2 logits. The
work per sample is eight MLP passes while the parameters (about 300k) are those of one:
that is what makes data parallelism pay on a 2-core machine at batch sizes of 128 and up
(compute that two replicas split, against one all-reduce of the parameters per step; a
plain 64-512-512-2 MLP on one vector per sample pays only from batch 1024 on).

Nothing is downloaded: the samples are generated from a fixed seed (Gaussian features; the
label is a random "teacher" network's decision on the set, with 5% of the labels flipped),
so every replica and every restart sees the same data.

    from mlp_data import SetMLP, load_mlp_datasets

    train_dataset, test_dataset = load_mlp_datasets()      # 16,000 / 4,000 samples
    logits = SetMLP()(train_dataset[0][0].unsqueeze(0))     # shape (1, 2)
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

__all__ = ["load_mlp_datasets", "SetMLP", "SET_SIZE", "NUM_FEATURES", "NUM_CLASSES"]

SET_SIZE = 8
NUM_FEATURES = 64
NUM_CLASSES = 2


def load_mlp_datasets(num_samples: int = 20_000, test_fraction: float = 0.2,
                      seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Generate the example's training and test sets.

    Arguments:
        num_samples: samples in total (split into training and test).
        test_fraction: share held out for testing, in (0, 1).
        seed: seed of the features, the teacher network and the label noise.

    Returns:
        ``(train_dataset, test_dataset)`` of ``(features, label)`` pairs: float32 features
        of shape ``(8, 64)`` (standard normal) and int64 labels in ``{0, 1}`` (balanced).

    Raises:
        ValueError: for ``num_samples < 10`` or a ``test_fraction`` outside (0, 1).
    """
    if num_samples < 10:
        raise ValueError(f"load_mlp_datasets(num_samples={num_samples!r}): need >= 10")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"load_mlp_datasets(test_fraction={test_fraction!r}): must be "
                         "strictly between 0 and 1")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, SET_SIZE, NUM_FEATURES, generator=g)
    hidden = torch.tanh(x @ torch.randn(NUM_FEATURES, 32, generator=g) / NUM_FEATURES ** 0.5)
    score = hidden.mean(dim=1) @ torch.randn(32, generator=g)
    y = (score > score.median()).long()
    flip = torch.rand(num_samples, generator=g) < 0.05
    y = torch.where(flip, 1 - y, y)
    n_test = int(round(num_samples * test_fraction))
    return (TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test]))


class SetMLP(torch.nn.Module):
    """A 64 -> 512 -> 512 MLP (ReLUs) on each vector of a set, averaged over the set, then a
    linear layer to the logits (about 300k parameters).

    Shape:
        input ``(N, 8, 64)`` float; output ``(N, 2)`` logits.
    """

    def __init__(self, hidden: int = 512):
        super().__init__()
        self.encoder = torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of sets, ``(N, 8, 64) -> (N, 2)``."""
        return self.head(self.encoder(x).mean(dim=1))
