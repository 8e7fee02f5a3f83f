"""An autoscaled loader iterated in plain loops, outside ``remaining_epochs_until``.

Each loop must be an epoch of its own (one epoch's statistical progress from where the
loop began), not stop yielding once the first epoch's progress is reached. Prints one
JSON line: the optimizer steps of each of ``LOOPS`` loops and the progress at the end.
"""

import json
import sys

import torch

import adaptdl_core.torch as adl
from adaptdl_core.torch import _metrics

LOOPS = 4


def main():
    adl.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x.sum(1, keepdim=True) + torch.randn(256, 1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = adl.AdaptiveDataParallel(model, opt)
    loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                    shuffle=True)
    loader.autoscale_batch_size(16)  # (the batch stays at 16: only the epochs matter)
    steps = []
    for _ in range(LOOPS):
        steps.append(0)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(xb), yb).backward()
            opt.step()
            steps[-1] += 1
    print(json.dumps({"steps": steps, "progress": _metrics.metrics().progress}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
