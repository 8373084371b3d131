"""The fused training step (back-propagation's backward and the optimiser's update as one call) against the
separate calls it replaces: ``rule.backward`` then ``torch.optim``'s ``step``."""
from __future__ import annotations

import warnings

import pytest
import torch

from inferlearn.engine.compiled import compiling
from inferlearn.errors import ConvergenceWarning
from inferlearn.models import MLP
from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig
from inferlearn.training.fused_step import FusedTrainStep
from inferlearn.training.loop import make_optimizer, train

OPTIMIZERS = [dict(optimizer="sgd", lr=0.1, momentum=0.0), dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3),
              dict(optimizer="adam", lr=0.01), dict(optimizer="adam", lr=0.01, weight_decay=1e-2),
              dict(optimizer="adamw", lr=0.01, weight_decay=1e-2)]


def _setup(opt: dict, rule: str = "backprop", options: dict | None = None, dtype=torch.float64):
    model = MLP([12, 9, 7, 4], "relu", seed=1).to(dtype)
    cfg = TrainConfig(data="digits", rule=rule, **opt)
    return model, make_rule(rule, options or {}), make_optimizer(cfg, [p for p in model.parameters()])


def _batches(n=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 12, generator=g, dtype=dtype), torch.randint(0, 4, (16,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: f"{o['optimizer']}-m{o.get('momentum', 0)}-wd{o.get('weight_decay', 0)}")
@pytest.mark.parametrize("rule, options", [("backprop", {}), ("backprop", {"loss": "cross-entropy"}),
                                           ("fenchel-bp", {"beta": 0.5}), ("pc", {"steps": 6}),
                                           ("pc", {"steps": 4, "output": "ce", "step_size": 0.2})])
def test_fused_step_equals_backward_then_optimizer_step(opt, rule, options):
    """Four steps of each path from the same weights (float64, eager): the same weights, optimiser state and losses."""
    ref_model, ref_rule, ref_opt = _setup(opt, rule, options)
    model, rule_, optimizer = _setup(opt, rule, options)
    step = FusedTrainStep.make(rule_, model, optimizer)
    assert step is not None
    with compiling("off"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in _batches():
            ref_opt.zero_grad(set_to_none=True)
            ref_loss = ref_rule.backward(ref_model, x, y).loss
            ref_opt.step()
            assert step(x, y) == pytest.approx(ref_loss, rel=1e-12)
    messages = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(messages) % 2 == 0 and messages[::2] == messages[1::2]   # PC's verdict: the same warnings, once each
    for p, q in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-10, atol=1e-12)
    for p, q in zip(ref_model.parameters(), model.parameters()):   # the state torch.optim resumes from
        for key, value in ref_opt.state[p].items():
            if torch.is_tensor(value):
                torch.testing.assert_close(optimizer.state[q][key].to(value.device, value.dtype), value, rtol=1e-10,
                                           atol=1e-12)


def test_fused_step_applies_only_where_it_computes_the_same_update():
    model, rule, opt = _setup(dict(optimizer="sgd", lr=0.1))
    assert FusedTrainStep.make(rule, model, opt) is not None
    assert FusedTrainStep.make(rule, model, opt, distributed=True) is None   # gradients averaged before the step
    assert FusedTrainStep.make(make_rule("pc", {"tol": 1e-3}), model, opt) is None   # stops on the host
    assert FusedTrainStep.make(make_rule("pc", {"nudging": "symmetric"}), model, opt) is None
    assert FusedTrainStep.make(make_rule("backprop", {"fused": False}), model, opt) is None
    nesterov = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    amsgrad = torch.optim.Adam(model.parameters(), lr=0.1, amsgrad=True)
    partial = torch.optim.SGD(list(model.parameters())[:2], lr=0.1)
    groups = torch.optim.SGD([{"params": list(model.parameters())[:2]}, {"params": list(model.parameters())[2:]}], lr=0.1)
    rms = torch.optim.RMSprop(model.parameters(), lr=0.1)
    for other in (nesterov, amsgrad, partial, groups, rms):
        assert FusedTrainStep.make(rule, model, other) is None
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    assert FusedTrainStep.make(rule, conv, torch.optim.SGD(conv.parameters(), lr=0.1)) is None


def test_a_schedule_after_fused_steps_alone_does_not_warn():
    """An epoch of fused steps only (no partial batch) counts as the optimiser's steps for its schedule."""
    model, rule, opt = _setup(dict(optimizer="sgd", lr=0.1))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 3)
    step = FusedTrainStep.make(rule, model, opt)
    with compiling("off"):
        for x, y in _batches(2):
            step(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schedule.step()


@pytest.mark.parametrize("rule", ["backprop", "pc"])
def test_training_with_the_fused_step_equals_the_separate_calls(tmp_path, monkeypatch, rule):
    """The loop's fused path (forced on, run eagerly) trains the same run as the separate calls: a learning-rate
    schedule, the epoch's last partial batch (separate calls) and momentum state carried across epochs."""
    base = dict(data="digits", arch="64-16-10", epochs=3, batch_size=64, lr=0.05, optimizer="sgd", momentum=0.9,
                lr_schedule="cosine", seed=2, dtype="float64", rule=rule)
    ref = train(TrainConfig(**base, out=str(tmp_path / "ref")), progress=False, log=None)
    calls = []
    real = FusedTrainStep.__call__

    def counted(self, x, labels):
        calls.append(len(x))
        return real(self, x, labels)

    monkeypatch.setattr(FusedTrainStep, "active", lambda self, device: True)
    monkeypatch.setattr(FusedTrainStep, "__call__", counted)
    fused = train(TrainConfig(**base, out=str(tmp_path / "fused")), progress=False, log=None)
    assert calls and set(calls) == {64}
    for a, b in zip(ref, fused):
        for key in ("train_loss", "batch_loss", "test_acc", "train_acc"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key


def _compiled_against_eager(opt: dict, rule: str = "backprop", options: dict | None = None, change=None) -> None:
    """Six float32 batches: the compiled fused step against the eager separate calls, to 1e-6; ``change(i,
    optimizers)`` may alter both optimisers before batch ``i``."""
    ref_model, ref_rule, ref_opt = _setup(opt, rule, options, dtype=torch.float32)
    model, rule, optimizer = _setup(opt, rule, options, dtype=torch.float32)
    step = FusedTrainStep.make(rule, model, optimizer)
    with compiling("on"):
        assert step.active(torch.device("cpu"))
        for i, (x, y) in enumerate(_batches(6, torch.float32)):
            if change is not None:
                change(i, (ref_opt, optimizer))
            ref_opt.zero_grad(set_to_none=True)
            with compiling("off"):
                ref_rule.backward(ref_model, x, y)
            ref_opt.step()
            step(x, y)
    for p, q in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("opt", OPTIMIZERS[1:], ids=["sgd-momentum-wd", "adam", "adam-wd", "adamw"])
@pytest.mark.parametrize("rule", ["backprop", "pc"])
def test_compiled_fused_step_equals_eager(opt, rule):
    """torch.compile of the whole step (float32) against the eager separate calls, to 1e-6."""
    _compiled_against_eager(opt, rule, {"steps": 20, "step_size": 0.3} if rule == "pc" else {})


@pytest.mark.slow
def test_compiled_fused_step_follows_changed_hyper_parameters():
    """Hyper-parameters are constants of the compiled graph: a change mid-run (weight decay, momentum, lr) must
    run a graph with the new values, not the one the step kept from earlier batches."""
    def change(i, optimizers):
        if i == 3:
            for o in optimizers:
                o.param_groups[0].update(weight_decay=0.05, momentum=0.5, lr=0.03)

    _compiled_against_eager(dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3), change=change)
