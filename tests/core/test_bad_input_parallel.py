"""Bad input to AdaptiveDataParallel: a non-module, an optimizer over another
model's parameters and a non-scaler fail at construction; a resume with another
optimizer type or model shape raises a CheckpointError that says what differs.
In-process, with a one-process gloo group (torch's own init, no signal handlers).
"""

import logging

import pytest
import torch

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("bad", ["x", None, 3, [torch.nn.Linear(2, 1)]])
def test_a_model_that_is_not_a_module_is_refused(process_group, bad):
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataParallel(bad, sgd(torch.nn.Linear(2, 1)))
    assert f"model={bad!r}" in str(info.value) and "torch.nn.Module" in str(info.value)
    assert type(bad).__name__ in str(info.value)
    assert checkpoint.state_names() == []


def test_an_optimizer_over_another_models_parameters_is_refused(process_group):
    # Once: it trained 8 steps without changing the weights.
    model, other = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataParallel(model, sgd(other))
    text = str(info.value)
    assert "SGD updates 2 parameter tensor(s), none of them Linear's" in text
    assert "model.parameters()" in text
    assert checkpoint.state_names() == []


def test_an_optimizer_with_extra_parameters_is_accepted_with_a_warning(process_group, caplog):
    # (A learnable loss weight outside the model is legitimate, but not averaged.)
    model, extra = torch.nn.Linear(2, 1), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.torch.parallel"):
        adl.AdaptiveDataParallel(model, opt)
    assert "updates 1 parameter tensor(s) that are not the model's" in caplog.text


@pytest.mark.parametrize("bad", ["fp16", 1.0, object()])
def test_a_mixed_precision_scaler_without_state_is_refused_at_construction(process_group, bad):
    # Once: it failed only at the first checkpoint ('str' object has no attribute ...).
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError) as info:
        adl.AdaptiveDataParallel(model, sgd(model), mp_scaler=bad)
    assert "mp_scaler=" in str(info.value) and "GradScaler" in str(info.value)
    assert type(bad).__name__ in str(info.value)
    assert checkpoint.state_names() == []


def test_a_grad_scaler_is_accepted(process_group, ckpt_dir):
    model = torch.nn.Linear(2, 1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    adl.AdaptiveDataParallel(model, sgd(model), mp_scaler=scaler)
    assert checkpoint.save_all_states() is not None


def trained_checkpoint(model, opt):
    ddp = adl.AdaptiveDataParallel(model, opt)
    opt.zero_grad()
    ddp(torch.ones(3, model.in_features)).sum().backward()
    opt.step()
    return checkpoint.save_all_states()


def test_resume_with_another_optimizer_type_names_both(process_group, ckpt_dir, restart):
    trained_checkpoint(model := torch.nn.Linear(2, 1), sgd(model))
    restart()
    model = torch.nn.Linear(2, 1)
    with pytest.raises(checkpoint.CheckpointError) as info:
        adl.AdaptiveDataParallel(model, torch.optim.Adam(model.parameters()))
    text = str(info.value)  # (once: KeyError: 'betas')
    assert "'SGD' optimizer" in text and "this run's optimizer is 'Adam'" in text
    assert "adaptdl-dataparallel" in text


def test_resume_with_the_same_optimizer_type_still_loads(process_group, ckpt_dir, restart):
    trained_checkpoint(model := torch.nn.Linear(2, 1), sgd(model))
    saved = model.weight.detach().clone()
    restart()
    model = torch.nn.Linear(2, 1)
    adl.AdaptiveDataParallel(model, sgd(model))
    assert torch.equal(model.weight.detach(), saved)


def test_an_optimizer_state_that_does_not_fit_names_both_types(process_group, ckpt_dir,
                                                               restart):
    # The same type with another number of parameter groups: torch's ValueError, kept
    # in the message with the types.
    trained_checkpoint(model := torch.nn.Linear(2, 1), sgd(model))
    restart()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    with pytest.raises(checkpoint.CheckpointError) as info:
        adl.AdaptiveDataParallel(model, opt)
    text = str(info.value)
    assert "saved by 'SGD' does not fit this run's 'SGD'" in text
    assert "parameter groups" in text


def test_resume_with_another_model_shape_says_which_sizes(process_group, ckpt_dir, restart):
    trained_checkpoint(model := torch.nn.Linear(2, 1), sgd(model))
    restart()
    model = torch.nn.Linear(4, 1)
    with pytest.raises(checkpoint.CheckpointError) as info:
        adl.AdaptiveDataParallel(model, sgd(model))
    text = str(info.value)  # (once it stopped at "Error(s) in loading state_dict for Linear:")
    assert "does not fit this Linear" in text
    assert "size mismatch for weight" in text
    assert "torch.Size([1, 2]) from checkpoint" in text and "torch.Size([1, 4])" in text
