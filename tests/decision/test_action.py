"""Decisions carry an Action enum member that still reads as its plain string."""

from __future__ import annotations

import json

import pytest

from adaptdl_core.decision import ACTIONS, Decision
from adaptdl_core.decision.core import Action


def test_a_decision_made_with_the_string_carries_the_enum_member():
    d = Decision("j", "resize", 2, ("n0", "n0"), "grows")
    assert d.action is Action.RESIZE
    # ...which equals, prints, formats and serialises as the plain string.
    assert d.action == "resize" and str(d.action) == "resize" and f"{d.action}" == "resize"
    assert json.dumps({"action": d.action}) == '{"action": "resize"}'
    assert {"resize": 1}[d.action] == 1 and {d.action: 1}["resize"] == 1  # same hash
    assert Decision("j", Action.WAIT, 0, (), "no room").action is Action.WAIT


def test_actions_lists_every_member_in_order():
    assert ACTIONS == tuple(Action)
    assert [a.value for a in ACTIONS] == ["start", "resize", "hold", "keep", "wait"]


def test_an_unknown_action_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"action must be one of \['start', 'resize', "
                                         r"'hold', 'keep', 'wait'\], got 'grow'"):
        Decision("j", "grow", 2, (), "?")
