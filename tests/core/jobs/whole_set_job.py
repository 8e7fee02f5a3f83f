"""A metric over a whole validation set, on any number of replicas.

The recipe of :mod:`adaptdl_core.torch.whole_set`: each replica adds its shard's sums
(without the padding of the last batch, :func:`adl.drop_padding`) to an Accumulator,
and ``synchronized()`` adds them up. Prints one JSON line per replica: for each of two
epochs, the recipe's accuracy, mean squared error, sample count and how often each
sample was counted; beside them what a replica sees alone (its shard) and what the
padding would add to the count.
"""

import json
import sys

import torch

import adaptdl_core.torch as adl

SIZE, BATCH = 101, 10  # (101 does not divide among 2 or 3 replicas: the last batch pads)


def main():
    adl.init_process_group("gloo")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SIZE, 5, generator=gen)
    y = (x[:, 0] + 0.5 * torch.randn(SIZE, generator=gen) > 0).long()
    index = torch.arange(SIZE)
    model = torch.nn.Linear(5, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-1.0, 0, 0, 0, 0], [1.0, 0.2, 0, 0, 0]]))
        model.bias.zero_()
    valid = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(x, y, index),
                                   batch_size=BATCH, shuffle=True)
    accum = adl.Accumulator()
    epochs = []
    for _epoch in adl.remaining_epochs_until(2):
        mine, padded = 0, 0
        for batch in valid:
            mine += len(batch[1])
            padded += valid.batch_padding
            xb, yb, ib = adl.drop_padding(batch)
            if len(yb):
                with torch.no_grad():
                    out = model(xb)
                accum["correct"] += (out.argmax(1) == yb).sum().item()
                accum["sq"] += (out[:, 1] - yb.float()).pow(2).sum().item()
                accum["total"] += len(yb)
                accum["seen"] += torch.bincount(ib, minlength=SIZE)
        with accum.synchronized():
            epochs.append({"accuracy": accum["correct"] / accum["total"],
                           "mse": accum["sq"] / accum["total"], "total": accum["total"],
                           "seen": accum["seen"].tolist(), "shard": mine,
                           "padding": padded})
            accum.clear()
    print(json.dumps({"epochs": epochs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
