"""Accumulator: sums statistics across replicas and across checkpoint-restarts."""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import copy
from typing import IO, Any, Iterator

import numpy as np
import torch

from adaptdl_core import checkpoint, collective, context
from adaptdl_core.torch.data import current_dataloader
from adaptdl_core.torch.epoch import current_epoch

__all__ = ["Accumulator"]


class Accumulator(collections.abc.MutableMapping):
    """A dict-like sum of statistics (loss, correct predictions, ...) over all replicas
    and all restarts of a job.

    It has two modes:

    * **Accumulation mode** (the default): ``accum["key"] += value``,
      ``accum.update(key=value)``, ``accum -= {...}`` and :meth:`subtract` add updates
      locally on each replica; replicas may make different updates. Reads behave as on an
      empty dict (``len(accum) == 0``).
    * **Synchronized mode**, inside ``with accum.synchronized():``: on entry the updates of
      all replicas are summed into the shared values, and the accumulator then acts as a
      plain dict with the same contents on every replica. Writes must be identical on all
      replicas.

    Pending updates are also summed when a checkpoint is taken. After a restart, a
    ``synchronized()`` block that already ran outside any data loader loop in the current
    epoch replays the values it saw then, so code after the loop computes the same
    metrics as before the restart::

        accum = Accumulator()
        for epoch in remaining_epochs_until(10):
            for x, y in valid_loader:
                accum["correct"] += (model(x).argmax(1) == y).sum().item()
                accum["total"] += len(y)
            with accum.synchronized():
                accuracy = accum["correct"] / accum["total"]
                accum.clear()

    Create accumulators outside data loader loops and in the same order on every replica.

    What it takes: ``+=`` and ``-=`` add numbers (``int``, ``float``, ``complex``, bools),
    numpy numbers and arrays, and torch tensors; a tensor that requires grad is added
    detached (``accum["loss"] += loss`` keeps its value, not the autograd graph of every
    batch). Anything else (a ``Fraction``, a string, ``None``) raises TypeError at the
    ``+=``, as it could not be summed over the replicas or loaded back from a checkpoint.
    Inside ``synchronized()`` values may also be strings, None, and lists, tuples and
    dicts of such values. Reading, comparing or printing an entry outside
    ``synchronized()`` raises TypeError: its value is known only once the replicas'
    updates are summed.

    For a metric over a whole validation set on any number of replicas, see
    :mod:`adaptdl_core.torch.whole_set` (each replica adds its shard's sums, without
    the padding of the last batch, and ``synchronized()`` adds them up).

    Arguments:
        *args: initial contents, as for ``dict``.
        **kwargs: initial contents, as for ``dict``.

    Raises:
        RuntimeError: if created while a data loader is being iterated.
        TypeError: for initial contents that are not a mapping or pairs, or that a
            checkpoint could not load back.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._state = _AccumulatorState(*args, **kwargs)
        checkpoint.load_state(self._state)
        self._sync_count: collections.Counter = collections.Counter()
        self._synchronized: dict | None = None

    @contextlib.contextmanager
    def synchronized(self) -> Iterator["Accumulator"]:
        """Enter synchronized mode (a collective: every replica must enter together).

        Yields:
            this accumulator, now behaving as a plain dict.
        """
        if self._synchronized is not None:
            yield self
            return
        epoch = current_epoch()
        history = self._state.results_history
        # Finished epochs are never replayed, so their saved results are not needed.
        for key in [k for k in history if k is not None and epoch is not None and k < epoch]:
            del history[key]
        count = self._sync_count[epoch]
        self._sync_count[epoch] += 1
        saved = history.setdefault(epoch, [])
        if count < len(saved):
            # This block already ran before the restart: replay what it saw (a copy, so
            # that the block may modify it and a later restart can replay it again).
            self._synchronized = copy.deepcopy(saved[count])
            self._state.updates.clear()
        else:
            self._state.sync()
            if current_dataloader() is None:
                # Inside a loader loop the code is not replayed, so nothing to remember.
                saved.append(copy.deepcopy(self._state.results))
            self._synchronized = self._state.results
        try:
            yield self
        finally:
            self._synchronized = None

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Add each ``key: value`` pair to the accumulated values (unlike ``dict.update``,
        which replaces them).

        Raises:
            TypeError: if the arguments are not a mapping, pairs or ``key=value``
                arguments, or a value cannot be added (see :class:`Accumulator`).
        """
        for key, value in _pairs("update", args, kwargs).items():
            self[key] += value

    def subtract(self, *args: Any, **kwargs: Any) -> None:
        """Subtract each ``key: value`` pair from the accumulated values.

        Raises:
            TypeError: as :meth:`update`.
        """
        for key, value in _pairs("subtract", args, kwargs).items():
            self[key] -= value

    def __iadd__(self, other: Any) -> "Accumulator":
        """``accum += {"a": 1}`` is ``accum.update({"a": 1})``."""
        self.update(other)
        return self

    def __isub__(self, other: Any) -> "Accumulator":
        """``accum -= {"a": 1}`` is ``accum.subtract({"a": 1})``."""
        self.subtract(other)
        return self

    def __getitem__(self, key: Any) -> Any:
        """Read a value (synchronized mode), or start an in-place update
        (``accum[key] += v`` in accumulation mode)."""
        if self._synchronized is not None:
            return self._synchronized[key]
        return _PendingUpdate(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Store a value (synchronized mode), or finish an in-place update
        (``accum[key] += v``) in accumulation mode.

        Raises:
            TypeError: for a plain assignment in accumulation mode, or a value that a
                checkpoint could not load back (see :class:`Accumulator`).
        """
        if self._synchronized is not None:
            _check_storable(key, value)
            self._synchronized[key] = value
            return
        # ``accum[k] += v`` is getitem, then ``tmp + v``, then setitem(k, tmp): the
        # _PendingUpdate from getitem carries v here.
        if not isinstance(value, _PendingUpdate) or value.accum is not self or value.key != key:
            raise TypeError("in accumulation mode an Accumulator only supports accum[key] += "
                            "value and accum[key] -= value; assign values inside "
                            "`with accum.synchronized():`")
        updates = self._state.updates
        updates[key] = updates[key] + value.delta if key in updates else value.delta

    def get(self, key: Any, default: Any = None) -> Any:
        """``dict.get`` in synchronized mode; ``default`` in accumulation mode."""
        return self._view().get(key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        """``dict.pop`` in synchronized mode; as on an empty dict in accumulation mode."""
        return self._view().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``dict.setdefault`` (synchronized mode only).

        Raises:
            TypeError: in accumulation mode, where only ``+=``/``-=`` updates exist.
        """
        if self._synchronized is None:
            raise TypeError("setdefault() needs synchronized mode; in accumulation mode use "
                            "accum[key] += value")
        return self._synchronized.setdefault(key, default)

    def __delitem__(self, key: Any) -> None:
        self._view().__delitem__(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())

    def __contains__(self, key: object) -> bool:
        return key in self._view()

    def __repr__(self) -> str:
        return f"Accumulator({self._view()!r})"

    def _view(self) -> dict:
        return self._synchronized if self._synchronized is not None else {}


def _addable(key: Any, value: Any, op: str) -> Any:
    """``value`` as an Accumulator adds it: a number, a numpy number or array, or a
    tensor (detached: its value, not its autograd graph, whose memory would otherwise be
    held until the next synchronized()). Raises TypeError for anything else."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (int, float, complex, np.number, np.bool_)) \
            or (isinstance(value, np.ndarray) and value.dtype.kind in "biufc"):
        return value
    raise TypeError(f"accum[{key!r}] {op} {value!r}: an Accumulator adds numbers (int, "
                    "float, complex), numpy numbers and arrays, and torch tensors, which "
                    "sum over the replicas and load back from a checkpoint; got a "
                    f"{type(value).__name__}. Convert it first, e.g. float(value) or "
                    "tensor.item()")


def _check_storable(key: Any, value: Any) -> None:
    """Raise TypeError if ``value`` (stored under ``key``) could be saved in a checkpoint
    but not loaded back (``torch.load(weights_only=True)``): only numbers, bools,
    strings, None, numpy numbers and arrays, tensors, and lists, tuples and dicts of
    them are."""
    if type(value) in (bool, int, float, complex, str, type(None)) \
            or isinstance(value, (torch.Tensor, np.number, np.bool_)):
        return
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_storable(key, k)
            _check_storable(key, v)
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_storable(key, v)
        return
    raise TypeError(f"accum[{key!r}] = ...: a {type(value).__name__} ({value!r}) cannot be "
                    "loaded back from a checkpoint; store numbers, bools, strings, None, "
                    "numpy numbers or arrays, tensors, or lists, tuples and dicts of them "
                    "(e.g. float(value))")


def _pairs(method: str, args: tuple, kwargs: dict) -> dict:
    """``dict(*args, **kwargs)``, with an error that names the method and the fix."""
    try:
        return dict(*args, **kwargs)
    except (TypeError, ValueError):
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        raise TypeError(f"Accumulator.{method}({shown}): pass a mapping ({{'loss': 0.5}}), "
                        "(key, value) pairs, or key=value arguments") from None


def _refuse(what: str) -> Any:
    """A method of _PendingUpdate that raises its "outside synchronized()" error."""
    def method(self: "_PendingUpdate", *args: Any, **kwargs: Any) -> Any:
        raise self._outside(what)
    return method


class _PendingUpdate:
    """What ``accum[key]`` returns in accumulation mode: collects ``+ v`` / ``- v``.
    Anything else done with it (reading, comparing, truth, arithmetic) raises a
    TypeError that explains synchronized()."""

    __slots__ = ("accum", "key", "delta")
    __array_ufunc__ = None  # (numpy defers to our reflected operators, which raise)

    def __init__(self, accum: Accumulator, key: Any):
        self.accum, self.key, self.delta = accum, key, 0

    def __add__(self, value: Any) -> "_PendingUpdate":
        if isinstance(value, _PendingUpdate):
            raise TypeError("cannot add two accumulator entries in accumulation mode")
        self.delta = self.delta + _addable(self.key, value, "+=")
        return self

    def __sub__(self, value: Any) -> "_PendingUpdate":
        if isinstance(value, _PendingUpdate):
            raise TypeError("cannot subtract accumulator entries in accumulation mode")
        self.delta = self.delta - _addable(self.key, value, "-=")
        return self

    def _outside(self, what: str) -> TypeError:
        return TypeError(
            f"{what} accum[{self.key!r}] outside `with accum.synchronized():`. In "
            "accumulation mode an entry only takes `+= value` and `-= value`: each "
            "replica's updates are pending until synchronized() sums them over all "
            "replicas. Read the value inside `with accum.synchronized():` (a collective: "
            "every replica enters it together).")

    def __getattr__(self, name: str) -> Any:
        # (Only for attributes that do not exist, e.g. .item(): an AttributeError, as
        # hasattr() expects, with the explanation.)
        raise AttributeError(str(self._outside(f"cannot use .{name} of")))

    def __repr__(self) -> str:
        return f"<pending update of accum[{self.key!r}]: read it inside synchronized()>"

    __bool__ = _refuse("cannot take the truth value of")
    __str__ = _refuse("cannot print")
    __format__ = _refuse("cannot format")
    __float__ = __int__ = __index__ = __complex__ = __array__ = _refuse("cannot convert")
    __len__ = _refuse("cannot take the length of")
    __iter__ = _refuse("cannot iterate over")
    __getitem__ = _refuse("cannot index")
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse("cannot compare")
    __hash__ = None  # type: ignore[assignment]
    __radd__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = \
        __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = \
        __matmul__ = __rmatmul__ = __neg__ = __pos__ = __abs__ = __round__ = \
        _refuse("cannot compute with")


def _plain(value: Any) -> Any:
    """Make ``value`` loadable with ``torch.load(weights_only=True)``."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _add_into(total: dict, updates: dict) -> dict:
    for key, value in updates.items():
        total[key] = total[key] + value if key in total else value
    return total


class _AccumulatorState(checkpoint.State):
    def __init__(self, *args: Any, **kwargs: Any):
        if current_dataloader() is not None:
            raise RuntimeError("create Accumulators outside data loader loops (they are "
                               "matched to their checkpoints by creation order)")
        epoch = current_epoch()
        prefix = f"adaptdl-accumulator-epoch{epoch}-"
        count = context.current().states.count_prefix(prefix)
        results = _pairs("__init__", args, kwargs)
        for key, value in results.items():
            _check_storable(key, value)
        super().__init__(f"{prefix}{count}")
        self.results: dict = results
        self.results_history: dict = {}
        self.updates: dict = {}

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({"results": _plain(self.results),
                    "history": _plain(self.results_history)}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        data = torch.load(fileobj, weights_only=True)
        self.results = data["results"]
        self.results_history = data["history"]

    def sync(self) -> None:
        # Sum every replica's pending updates (in rank order) into the shared results.
        total = collective.allreduce(self.updates, lambda a, b: _add_into(dict(a), b))
        _add_into(self.results, total)
        self.updates.clear()
