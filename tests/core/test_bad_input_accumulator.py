"""Bad input to Accumulator: what it cannot sum or load back fails at the
``+=`` with the key, the value and the fix; reading an entry outside ``synchronized()``
explains synchronized(); tensors that require grad are added detached. In-process.
"""

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint

SYNC_HINT = "inside `with accum.synchronized():`"


# -- reading an entry outside synchronized() ---------------------------------------------

READS = {
    "bool": lambda e: bool(e),
    "if": lambda e: 1 if e else 0,
    "float": lambda e: float(e),
    "int": lambda e: int(e),
    "round": lambda e: round(e),
    "compare >": lambda e: e > 1,
    "compare ==": lambda e: e == 0,
    "str": lambda e: str(e),
    "f-string": lambda e: f"{e:.3f}",
    "divide": lambda e: e / 2,
    "reflected add": lambda e: 3 + e,
    "numpy": lambda e: np.float64(1.0) + e,
    "tensor": lambda e: torch.tensor(1.0) + e,
    "index": lambda e: e[0],
    "hash": lambda e: {e},
}


@pytest.mark.parametrize("how", list(READS))
def test_reading_an_entry_outside_synchronized_explains_it(how):
    acc = adl.Accumulator()
    acc["n"] += 1
    with pytest.raises(TypeError) as info:
        READS[how](acc["n"])
    if how != "hash":  # (unhashable: Python's own message, from __hash__ = None)
        assert "accum['n'] outside" in str(info.value) and SYNC_HINT in str(info.value)
    with acc.synchronized():
        assert acc["n"] == 1  # the update was kept


def test_an_attribute_of_an_entry_outside_synchronized_explains_it():
    acc = adl.Accumulator()
    with pytest.raises(AttributeError) as info:
        acc["loss"].item()
    assert ".item of accum['loss']" in str(info.value) and SYNC_HINT in str(info.value)
    assert not hasattr(acc["loss"], "item")  # (still an AttributeError for hasattr)


def test_bool_of_an_entry_was_once_true():
    acc = adl.Accumulator()
    with pytest.raises(TypeError, match="truth value of accum"):
        assert not acc["n"]


# -- values that cannot be summed or loaded back ------------------------------------------

@pytest.mark.parametrize("bad", ["x", None, Fraction(1, 3), Decimal("0.5"), [1, 2], {"a": 1},
                                 object(), np.array(["a"])],
                         ids=["str", "None", "Fraction", "Decimal", "list", "dict", "object",
                              "str-array"])
@pytest.mark.parametrize("op", ["+=", "-="])
def test_adding_a_value_it_cannot_sum_or_restore_fails_at_the_call(bad, op):
    acc = adl.Accumulator()
    acc["k"] += 1
    with pytest.raises(TypeError) as info:
        if op == "+=":
            acc["k"] += bad
        else:
            acc["k"] -= bad
    text = str(info.value)
    assert f"accum['k'] {op} {bad!r}" in text and type(bad).__name__ in text
    assert "float(value)" in text
    with acc.synchronized():
        assert dict(acc) == {"k": 1}  # the bad update left nothing behind


@pytest.mark.parametrize("good", [True, 2, 0.5, 1j, np.int64(3), np.float32(0.5),
                                  np.bool_(True), np.arange(2), torch.ones(2)])
def test_values_it_can_sum_are_accepted(good):
    acc = adl.Accumulator()
    acc["k"] += good
    acc["k"] += good
    with acc.synchronized():
        value = acc["k"]
    expected = 0 + good + good  # (the sum starts at 0: np.bool_ counts, not ORs)
    assert np.allclose(np.asarray(value), np.asarray(expected))


def test_a_fraction_once_reached_the_checkpoint_and_broke_the_resume(ckpt_dir, restart):
    acc = adl.Accumulator()
    with pytest.raises(TypeError, match="Fraction"):
        acc["third"] += Fraction(1, 3)
    acc["third"] += 1 / 3
    checkpoint.save_all_states()
    restart()
    acc = adl.Accumulator()  # loads back
    with acc.synchronized():
        assert acc["third"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("bad", [Fraction(1, 2), [Decimal(1)], {"a": object()}],
                         ids=["Fraction", "list-of-Decimal", "dict-of-object"])
def test_storing_what_a_checkpoint_cannot_load_back_fails_at_the_assignment(bad):
    acc = adl.Accumulator()
    with acc.synchronized():
        with pytest.raises(TypeError) as info:
            acc["best"] = bad
        assert "accum['best'] = ..." in str(info.value)
        acc["best"] = {"epoch": 3, "name": "x", "scores": [0.5, None], "t": torch.ones(1)}
    with pytest.raises(TypeError, match="cannot be loaded back"):
        adl.Accumulator(a=Fraction(1, 2))
    assert len([n for n in checkpoint.state_names() if "accumulator" in n]) == 1


@pytest.mark.parametrize("bad", [3, "ab", [1, 2], None])
def test_update_with_a_non_mapping_names_the_call(bad):
    acc = adl.Accumulator()
    for method in ("update", "subtract"):
        with pytest.raises(TypeError) as info:
            getattr(acc, method)(bad)
        assert f"Accumulator.{method}({bad!r})" in str(info.value)
        assert "key=value" in str(info.value)
    with pytest.raises(TypeError, match=r"Accumulator.update"):
        acc += bad
    with pytest.raises(TypeError, match=r"Accumulator.__init__"):
        adl.Accumulator(bad)


def test_update_with_pairs_still_works():
    acc = adl.Accumulator()
    acc.update([("a", 1), ("b", 2)])
    acc.update({"a": 1}, b=1)
    with acc.synchronized():
        assert dict(acc) == {"a": 2, "b": 3}


# -- tensors that require grad -----------------------------------------------------------

def test_a_loss_that_requires_grad_is_added_detached(ckpt_dir, restart):
    # Once: a deepcopy error at the first synchronized().
    weight = torch.ones(3, requires_grad=True)
    acc = adl.Accumulator()
    for _ in range(2):
        loss = (weight * 2).sum()
        acc["loss"] += loss
    assert loss.requires_grad  # the caller's tensor is untouched
    with acc.synchronized():
        assert not acc["loss"].requires_grad and acc["loss"].item() == 12.0
    checkpoint.save_all_states()
    restart()
    acc = adl.Accumulator()
    with acc.synchronized():
        assert acc["loss"].item() == 12.0
