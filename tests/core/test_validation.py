"""The numeric argument checks shared by the library (adaptdl_core.validation)."""

import math

import pytest

from adaptdl_core import validation


def test_numbers_within_bounds_pass_through_as_floats():
    assert validation.number("x", 3) == 3.0 and isinstance(validation.number("x", 3), float)
    assert validation.number("x", 0.0, 0.0) == 0.0            # closed bound
    assert validation.number("x", 0.5, 0.0, 1.0, low_open=True, high_open=True) == 0.5


@pytest.mark.parametrize("value, kwargs, text", [
    (0.0, dict(low=0.0, low_open=True), "x must be a finite number > 0, got 0.0"),
    (1.0, dict(low=0.0, high=1.0, low_open=True, high_open=True),
     "x must be a finite number in (0, 1), got 1.0"),
    (-1, dict(low=0.0), "x must be a finite number >= 0, got -1"),
    (math.inf, {}, "x must be a finite number, got inf"),
    ("a", {}, "x must be a finite number, got 'a'"),
    ("1.5", {}, "x must be a finite number, got '1.5'"),  # text to parse, not a number
    (b"2", {}, "x must be a finite number, got b'2'"),
    (True, {}, "x must be a finite number, got True"),
])
def test_bad_numbers_name_the_argument_and_the_range(value, kwargs, text):
    with pytest.raises(ValueError) as info:
        validation.number("x", value, **kwargs)
    assert str(info.value) == text


def test_integers_reject_floats_bools_and_out_of_range():
    assert validation.integer("n", 4, low=1) == 4
    for bad in (4.0, True, "4", 0):
        with pytest.raises(ValueError, match=r"^n must be an integer >= 1, got"):
            validation.integer("n", bad, low=1)
    with pytest.raises(ValueError, match=r"in \[0, 3\]"):
        validation.integer("n", 4, low=0, high=3)
    with pytest.raises(ValueError, match=r"^n must be an integer <= 1000000, got 1000001$"):
        validation.integer("n", 10 ** 6 + 1, high=10 ** 6)  # integer bounds in full


def test_integers_accept_numpy_integers_and_integral_floats_where_asked():
    import numpy as np
    assert validation.integer("n", np.int64(5), low=1) == 5
    assert type(validation.integer("n", np.int64(5))) is int
    assert validation.integer("n", 64.0, low=1, integral_floats=True) == 64
    for bad in (64.5, math.inf, math.nan, "64", True, np.bool_(True)):
        with pytest.raises(ValueError, match="^n must be an integer"):
            validation.integer("n", bad, integral_floats=True)
