"""Single-replica gradient noise measurement against an analytic truth.

Linear regression y = x.w* + e (x ~ N(0, I_d), e ~ N(0, noise_var)) with the model held
at w = 0 (lr 0): the per-sample gradient of 0.5 (x.w - y)^2 has |G|^2 = |w*|^2 and
tr(Sigma) = (d + 1)|w*|^2 + d * noise_var. An autoscaled loader whose cap equals the
batch (the batch stays fixed): with one replica the half-batch measurement runs, with
several the replicas' gradients are compared on sampled steps. With the argument
``pairs`` the micro-batch lower bound is the batch itself, so one replica measures on
sampled steps of two whole batches instead (the cap is then twice the batch, the local
bound keeps the batch fixed). With ``bucket_view`` DDP reduces the gradients in place
(``gradient_as_bucket_view=True``), so several replicas measure their local norms
parameter by parameter. Prints one JSON line with the estimates and the truth.
"""

import json
import math
import sys

import torch

import adaptdl_core.torch as adl


def main():
    pairs = "pairs" in sys.argv[1:]
    bucket_view = "bucket_view" in sys.argv[1:]
    d, noise_var, size, batch = 8, 4.0, 4096, 32
    torch.manual_seed(0)
    adl.init_process_group("gloo")
    w_star = torch.full((d,), math.sqrt(1.0 / d))
    x = torch.randn(size, d)
    y = x @ w_star + math.sqrt(noise_var) * torch.randn(size)
    data = torch.utils.data.TensorDataset(x, y)
    model = torch.nn.Linear(d, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ddp = adl.AdaptiveDataParallel(model, opt, gradient_as_bucket_view=bucket_view)
    loader = adl.AdaptiveDataLoader(data, batch_size=batch, shuffle=True)
    if pairs:
        loader.autoscale_batch_size(2 * batch, local_bsz_bounds=(batch, batch))
    else:
        loader.autoscale_batch_size(batch)
    halves = steps = pair_steps = 0
    for _epoch in adl.remaining_epochs_until(12):
        for xb, yb in loader:
            opt.zero_grad()
            (0.5 * (ddp(xb).squeeze(1) - yb).pow(2).mean()).backward()
            pair_steps += loader.is_accumulation_step  # (the first of a measured two)
            opt.step()
            halves += len(yb) == batch // 2
            steps += 1
    sqr = float(w_star.pow(2).sum())
    print(json.dumps({"sqr": ddp.gns.sqr_avg(), "var": ddp.gns.var_avg(),
                      "true_sqr": sqr, "true_var": ((d + 1) * sqr + d * noise_var) / batch,
                      "updates": ddp.gns.num_updates, "halves": halves, "steps": steps,
                      "pair_steps": pair_steps, "batch": loader.current_batch_size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
