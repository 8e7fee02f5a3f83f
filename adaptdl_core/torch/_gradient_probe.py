"""What AdaptiveDataParallel does around DDP's gradient all-reduce, step by step.

DDP's own all-reduce (C++, overlapped with the backward pass) averages the gradients
over replicas; most steps run no Python during the backward pass at all. This module
adds, only on the steps that need it:

- **Averaging over micro-batches.** On a step that accumulates micro-batches, hooks on
  every parameter divide its local gradient by the number of micro-batches as soon as it
  is complete, *before* DDP copies it into its bucket (a parameter's post-accumulate-grad
  hook runs before DDP's own hook on it).
- **The gradient noise.** With several replicas, on the steps the loader samples (see
  ``sampler.replicas_measure``) the local gradients' squared norms are taken in one fused
  call when the backward pass has computed them all, before DDP copies its averages
  back into ``.grad`` (an autograd-engine callback queued from a hook on the model's
  output runs before the one DDP queues to finish its all-reduces); the averaged
  gradient's norm is taken from ``.grad`` after the backward pass. (With
  ``gradient_as_bucket_view=True`` ``.grad`` *is* DDP's bucket, reduced in place while
  the backward pass still runs: then per-parameter hooks take each local norm as its
  gradient completes.) The replicas' local norms are summed with the side values
  (below). A single replica has one
  gradient per step: on sampled steps the loader splits the batch into two micro-batches,
  and the first one's gradient (copied when the second one's forward starts) and the
  step's average give the two-batch estimate.
- **Side values.** Every few steps (as many as take about ``SIDE_VALUES_INTERVAL_S`` of
  training, from 1 to ``SIDE_VALUES_MAX_EVERY``), a small all-reduce of its own, started
  at the step's first forward pass and read when the step ends (so it overlaps the
  step's compute), sums the graceful-stop flag, the in-place checkpoint flag, replica
  0's batch size choice, the replicas' proposals for the next interval and the local
  norms of the measured steps since the last one; the data loader applies the first
  three at the batch boundary after the step.
- **The sync wait** of the measured steps, from the last local gradient to the end of
  the backward pass (DDP waits for its all-reduces there), for the throughput model.

Norms are preconditioned for Adam-family optimizers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

from adaptdl_core.torch import _interrupt, _metrics
from adaptdl_core.torch import boundary
from adaptdl_core.torch.gradient_noise_scale import adam_preconditioner, preconditioned_sqr_norm

if TYPE_CHECKING:
    from adaptdl_core.torch.step_cycle import StepCycle, StepPlan

# A small all-reduce costs each replica a few hundred microseconds of CPU (launch, gloo
# thread, wait), which a step of a few milliseconds feels; a stop request or a new batch
# size, on the other hand, waits for the next one (a fifth of a second is little next to
# a checkpoint-restart, or to a batch size kept for thousands of steps). So the side
# values go every as many optimizer steps as take about this long (every step when steps
# are slower), agreed by the replicas in the side values themselves (the mean of their
# proposals, from their own step times)...
SIDE_VALUES_INTERVAL_S = 0.2
# ...but at least every this many steps; also the number of measurement slots (every step
# is measured at first), so the noise estimate loses nothing.
SIDE_VALUES_MAX_EVERY = 64
SIDE_VALUES_FIRST_EVERY = 4  # before any step time is known
# Stop flag, in-place checkpoint flag, replica 0's (local batch, accumulation steps),
# interval proposals.
_HEADER = 5


class Measurement(NamedTuple):
    """One two-batch gradient noise measurement, for ``GradientNoiseScale.update``."""
    local_sqr: float   # mean over the gradients of their squared norms
    total_sqr: float   # squared norm of their mean
    num_grads: int     # how many gradients (replicas or micro-batches)
    batch_size: int    # samples in the step
    elapsed: int       # samples trained since the previous measurement


class GradientProbe:
    """The per-step state of the micro-batch averaging, the noise measurement and the
    side values of one AdaptiveDataParallel (a plain object: setting attributes on a
    torch Module is slow, and these change every step).

    Arguments:
        params: the parameters DDP synchronises (those that require a gradient).
        optimizer: their optimizer (its Adam state preconditions the norms if
            ``precondition``).
        replicas: the number of replicas.
        precondition: measure norms in Adam's preconditioned space.
    """

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer,
                 replicas: int, precondition: bool, grads_in_buckets: bool = False):
        self.params = params
        self.optimizer = optimizer
        self.replicas = replicas
        self.precondition = precondition
        # DDP's gradient_as_bucket_view: .grad is reduced in place during the backward pass.
        self.grads_in_buckets = grads_in_buckets
        self.since_measure = 0  # samples trained since the last noise measurement
        # Between the micro-batches of one optimizer step: zero_grad() must not clear
        # the gradients accumulated so far.
        self.accumulating = False
        # The hooks armed for one backward pass, and what they do; whether the coming
        # forward pass's output should be hooked (to learn when the backward pass starts).
        self.hooks: list[Any] = []
        self.hook_micros = 1
        self.hook_measure = False
        self.hook_output = False
        # Single replica: a copy of the first micro-batch's gradient of a measured step.
        self.first_grads: list[torch.Tensor] = []
        self.first_params: list[torch.Tensor] | None = None
        self.first_copied: tuple[int, int] | None = None  # (step cycle id, step) copied last
        # Several replicas: measured steps whose local norms are not sent yet, those sent
        # with the side values in flight (local, total, batch, elapsed), the side
        # all-reduce (tensor, work), the (loader, step) it was started at, and its group
        # (gloo, so the numbers stay on the CPU whatever the gradients' backend).
        self.unsent: list[tuple[float, float, int, int]] = []
        self.in_flight: list[tuple[float, float, int, int]] = []
        self.side_work: tuple[torch.Tensor, Any] | None = None
        self.side_step: tuple[int, int] | None = None
        self.side_group = _side_values_group() if replicas > 1 else None
        # The agreed schedule: the training loader's step number at which the next side
        # values start, and the interval after it; this replica's last start (time, step)
        # for its proposal of the next interval.
        self.side_next = 0
        self.side_every = SIDE_VALUES_FIRST_EVERY
        self.side_clock: tuple[float, int] | None = None
        self._reset_step()

    def _reset_step(self) -> None:
        self.measured = False        # this step's local norms were measured
        self.local_parts: list[Any] = []  # this replica's |g|^2 (per parameter, or summed)
        self.backward_started = False  # the output's hook queued the engine callback
        self.last_ready = 0.0        # when the last local gradient was complete
        self.last_done = 0.0         # when the backward pass, all-reduces included, ended

    # -- around the forward and backward passes ------------------------------------------
    def before_forward(self, step: "StepCycle", sync: bool) -> None:
        """A forward pass of a training loop's micro-batch is about to run (``step``: the
        loader's step machinery); ``sync``: it is the step's last micro-batch (its
        backward pass synchronises)."""
        plan = step.plan
        micro = step.micro_index
        if self.replicas > 1 and micro == 0 and self._side_values_due(plan.index):
            self._start_side_values(step, plan.index)
        if micro == 1 and plan.measures_first_micro_batch:
            key = (id(step), plan.index)
            if self.first_copied != key:
                # The accumulated gradient is still the first micro-batch's alone.
                self.first_copied = key
                self._copy_first_grads()
        self.disarm()  # (left over from a forward pass without a backward pass)
        self.hook_output = False
        if sync:
            self._arm(plan)

    def _arm(self, plan: StepPlan) -> None:
        """Prepare the coming backward pass if the step accumulates micro-batches (every
        parameter's hook divides its gradient) or measures the noise with several
        replicas (the output's hook, see :meth:`after_forward`)."""
        micros = plan.micros
        measure = self.replicas > 1 and plan.measures_replicas and self._can_measure()
        if micros == 1 and not measure:
            return
        self.hook_micros, self.hook_measure = micros, measure
        if micros > 1 or (measure and self.grads_in_buckets):
            self.hooks = [p.register_post_accumulate_grad_hook(self._on_local_grad)
                          for p in self.params]
        self.hook_output = True

    def after_forward(self, output: Any) -> None:
        """The forward pass of an armed step returned ``output``: hook its tensors, so that
        the backward pass's start queues :meth:`_local_grads_done` (autograd-engine
        callbacks run in order when the backward pass ends; DDP queues its own, which
        waits for the all-reduces and copies the averages into ``.grad``, only when its
        last bucket is ready, after ours)."""
        self.hook_output = False
        for tensor in _grad_tensors(output):
            self.hooks.append(tensor.register_hook(self._on_backward_start))

    def disarm(self) -> None:
        """Remove the hooks of this step, if any."""
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def _can_measure(self) -> bool:
        # (Adam before its first step has no preconditioner to measure in.)
        return not (self.precondition and not self.optimizer.state)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        """The gradient of one of the model's outputs is computed: the backward pass of an
        armed step has started (the first such hook queues the callback)."""
        if not self.backward_started:
            self.backward_started = True
            # (torch has no public API to queue an autograd-engine callback; DDP uses this.)
            torch.autograd.Variable._execution_engine.queue_callback(self._local_grads_done)

    def _on_local_grad(self, param: torch.Tensor) -> None:
        """A parameter's gradient of this replica is complete; DDP has not read it yet.
        Average it over the micro-batches (a replica's local gradient is its mean over its
        micro-batches), and measure it if DDP is about to reduce it in place."""
        grad = param.grad
        if grad is None:
            return
        if self.hook_micros > 1:
            grad.div_(self.hook_micros)
        if self.hook_measure and self.grads_in_buckets:
            self.measured = True
            self.local_parts.append(self._sqr_norm(param, grad))

    def _local_grads_done(self) -> None:
        """Engine callback: every local gradient of the step is complete (and averaged over
        the micro-batches); DDP's all-reduces may still run, its averages are not in
        ``.grad`` yet. Measure the local norms in one call, and queue the callback that
        runs after DDP's (the end of the sync wait)."""
        self.last_ready = time.perf_counter()
        self.disarm()
        if self.hook_measure and not self.grads_in_buckets:
            params = [p for p in self.params if p.grad is not None]
            if params:
                self.measured = True
                self.local_parts.append(
                    self._sqr_norms_sum(params, [p.grad.detach() for p in params]))
        # (torch's engine, as above.)
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self.last_done = time.perf_counter()

    # -- after the step's last backward pass ---------------------------------------------
    def after_backward(self, step: "StepCycle", batch_size: int) -> list[Measurement]:
        """The step's gradients are averaged (in ``.grad``), before the optimizer step.

        Records the step's sync wait if it was timed, and returns the noise measurements
        complete now: this step's with one replica; with several, those of the measured
        steps whose side values came back in this step.
        """
        self.disarm()
        self.since_measure += batch_size
        found: list[Measurement] = []
        if self.replicas == 1:
            micros = step.plan.micros
            if self.first_params is not None and micros > 1:
                # n micro-batches of b = M / n samples, averaged into m, the first one
                # g_1: with local = |m|^2 + |g_1 - m|^2, E[local] = |G|^2 + tr(Sigma) / b
                # (g_1 - m is pure noise: E|g_1 - m|^2 = tr(Sigma) / b * (n - 1) / n), so
                # the two-batch estimators stay unbiased; for n = 2 local is exactly
                # (|g_1|^2 + |g_2|^2) / 2.
                total, spread = self._single_replica_norms()
                found.append(Measurement(total + spread, total, micros, batch_size,
                                         self.since_measure))
                self.since_measure = 0
            self.first_params = None
        else:
            if self.last_done > self.last_ready > 0.0:
                # (Timed only on steps whose hooks were armed: the others run none.)
                _metrics.record_sync_time(self.last_done - self.last_ready)
            found = self._receive_side_values(batch_size)
        self._reset_step()
        return found

    # -- norms -----------------------------------------------------------------------------
    def _sqr_norm(self, param: torch.Tensor, grad: torch.Tensor) -> "float | torch.Tensor":
        if not self.precondition:
            return _blocked_sqr_norm(grad)
        v, eps, bc2 = adam_preconditioner(self.optimizer, param)
        return preconditioned_sqr_norm(grad.view_as(param), v, eps, bc2)

    def _sqr_norms_sum(self, params: list[torch.Tensor],
                       grads: list[torch.Tensor]) -> "float | torch.Tensor":
        """Sum of the (preconditioned) squared norms of ``grads``, one per parameter: a
        float64 scalar tensor on the gradients' device (not read yet: on a GPU reading
        is a synchronisation), or a float when preconditioned."""
        if self.precondition:
            return float(sum(self._sqr_norm(p, g) for p, g in zip(params, grads)))
        if not grads:
            return 0.0
        # Fused float32 norms, squared and summed in float64.
        return torch.stack(torch._foreach_norm(grads)).double().pow_(2).sum()

    def _copy_first_grads(self) -> None:
        """Keep a copy of the gradients accumulated so far (the first micro-batch's), in
        buffers reused from one measured step to the next."""
        params = [p for p in self.params if p.grad is not None]
        if not params or not self._can_measure():
            self.first_params = None
            return
        grads = [p.grad.detach() for p in params]
        buffers = self.first_grads
        if len(buffers) != len(grads) or any(b.shape != g.shape or b.dtype != g.dtype
                                             for b, g in zip(buffers, grads)):
            buffers = self.first_grads = [torch.empty_like(g) for g in grads]
        torch._foreach_copy_(buffers, grads)
        self.first_params = params

    def _single_replica_norms(self) -> tuple[float, float]:
        """``(|m|^2, |g_1 - m|^2)`` for the step's averaged gradient ``m`` (now in the
        parameters' ``.grad``) and the first micro-batch's copied gradient ``g_1``."""
        params = self.first_params
        grads = [p.grad.detach() for p in params]
        diffs = self.first_grads
        torch._foreach_sub_(diffs, grads)
        total, spread = _read_floats(self._sqr_norms_sum(params, grads),
                                               self._sqr_norms_sum(params, diffs))
        return total, spread

    # -- side values (several replicas) ----------------------------------------------------
    def _side_values_due(self, step: int) -> bool:
        """Whether the step now starting (``StepPlan.index``) is the agreed one for the
        next side values. (Every replica runs the same steps and reads the same sums:
        they agree.)"""
        # (A step number far below the agreed one means another loader, counting from its
        # own start: it restarts the schedule instead of waiting.)
        return step >= self.side_next or self.side_next - step > SIDE_VALUES_MAX_EVERY

    def _start_side_values(self, cycle: "StepCycle", step: int) -> None:
        """Start summing over the replicas [stop flag, in-place checkpoint flag,
        replica 0's choice of (local batch, accumulation steps) or zeros, a proposal for
        the next interval, then per measured step since the last time (local |g|^2, 1)];
        read in :meth:`_receive_side_values` when the step ends."""
        key = (id(cycle), step)
        if self.side_step == key or self.side_work is not None:
            return  # (a second forward pass in the same step)
        self.side_step = key
        # Every replica measures the same steps: the slots line up. (More than the slots
        # only when steps ran outside a loader's schedule: drop the oldest.)
        self.in_flight, self.unsent = self.unsent[-SIDE_VALUES_MAX_EVERY:], []
        proposal = cycle.take_proposal()
        requests = _interrupt.local_requests()
        values = [float(requests.exit), float(requests.save),
                  float(proposal[0]) if proposal else 0.0,
                  float(proposal[1]) if proposal else 0.0,
                  float(self._propose_interval(step))]
        for local, *_ in self.in_flight:
            values += [local, 1.0]
        values += [0.0] * (_HEADER + 2 * SIDE_VALUES_MAX_EVERY - len(values))
        side = torch.tensor(values, dtype=torch.float64)
        self.side_work = (side, dist.all_reduce(side, group=self.side_group, async_op=True))

    def _propose_interval(self, step: int) -> int:
        """Steps until the next side values, from this replica's mean step time since
        its last ones: about ``SIDE_VALUES_INTERVAL_S`` of training."""
        now = time.perf_counter()
        last, self.side_clock = self.side_clock, (now, step)
        if last is None or step <= last[1]:
            return self.side_every
        step_s = (now - last[0]) / (step - last[1])
        return max(1, min(SIDE_VALUES_MAX_EVERY, int(SIDE_VALUES_INTERVAL_S / max(step_s, 1e-9))))

    def _receive_side_values(self, batch_size: int) -> list[Measurement]:
        """Keep this step's norms for the next side values; if side values were sent in
        this step, return the measurements they completed and hand the agreed requests
        (stop, in-place checkpoint) and batch choice to the loader's next boundary."""
        if self.measured:
            params = [p for p in self.params if p.grad is not None]
            local, total = _read_floats(
                _sum_parts(self.local_parts),
                self._sqr_norms_sum(params, [p.grad.detach() for p in params]))
            self.unsent.append((local, total, batch_size, self.since_measure))
            self.since_measure = 0
        agreed, choice = boundary.side_values_owed()
        found = []
        if self.side_work is not None:
            tensor, work = self.side_work
            self.side_work = None
            work.wait()
            stop, save, bsz, accum, every, *slots = tensor.tolist()
            # (The mean of the proposals, each within bounds.)
            self.side_every = round(every / self.replicas)
            self.side_next = self.side_step[1] + self.side_every
            for (_, total, batch, elapsed), local_sum, count in zip(
                    self.in_flight, slots[0::2], slots[1::2]):
                if round(count) == self.replicas:
                    found.append(Measurement(local_sum / self.replicas, total, self.replicas,
                                             batch, elapsed))
            self.in_flight = []
            agreed = agreed | _interrupt.Requests(stop > 0, save > 0)
            if bsz > 0:
                choice = (int(round(bsz)), int(round(accum)))
        # Boundaries between side values need no collective of their own.
        boundary.post_side_values(agreed, choice)
        return found


def _side_values_group() -> Any:
    """The process group for the side values: the default one if it is gloo, else a gloo
    group over the same processes (created collectively, so every replica must construct
    AdaptiveDataParallel at the same point)."""
    if "gloo" in str(dist.get_backend()):  # also "cpu:gloo,cuda:nccl"
        return None
    return dist.new_group(backend="gloo")


# -- small tensor helpers: squared norms, accumulated on the device and read once per step
# (on a GPU every read is a synchronisation)
def _grad_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a forward pass's output (nested lists, tuples, dicts) that the
    backward pass will reach."""
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (list, tuple)):
        items = output
    elif isinstance(output, dict):
        items = output.values()
    else:
        return []
    return [t for item in items for t in _grad_tensors(item)]


def _blocked_sqr_norm(flat: torch.Tensor, block: int = 1 << 16) -> torch.Tensor:
    """|x|^2 with float32 products and float64 accumulation across blocks: as accurate
    as a float64 norm for our purposes (relative error ~1e-7 within a block, the sum of
    blocks exact to ~1e-16) and many times faster. A float64 scalar tensor on ``flat``'s
    device: read the step's sum once (on a GPU, reading it is a synchronisation)."""
    flat = flat.reshape(-1)
    if flat.dtype == torch.float64:
        return torch.dot(flat, flat)
    flat = flat.float()
    if flat.numel() <= block:  # (most parameters: one product, no split)
        return torch.dot(flat, flat).double()
    return torch.stack([torch.dot(c, c) for c in flat.split(block)]).double().sum()


def _sum_parts(parts: list[Any]) -> "float | torch.Tensor":
    """The sum of squared norms (float64 tensors on one device, or floats when
    preconditioned), not read from the device yet."""
    if not parts:
        return 0.0
    if isinstance(parts[0], torch.Tensor):
        return parts[0] if len(parts) == 1 else torch.stack(parts).sum()
    return float(sum(parts))


def _read_floats(*values: "float | torch.Tensor") -> list[float]:
    """``values`` as floats, the tensors among them read from their device at once (on a
    GPU every read is a synchronisation)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else ())
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
