"""Compiled inference steps (``inferlearn.engine.compiled``): equal to eager, and eager with one warning on failure.

Oracle: the eager step, the same function without ``torch.compile``. After three SGD steps from the same
weights the compiled run's gradients equal the eager run's to float32 tolerance (the lifted solvers stop
on a tolerance, so the gradient can differ by the solver's tolerance, 1e-5, scaled). Compiling costs
about 10 s per step function on one CPU thread, so the default run compiles one rule (contrastive, the
block sweep) and the other rules are ``slow``.
"""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

from inferlearn.engine import compiled as C
from inferlearn.models import MLP
from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig


@pytest.fixture(autouse=True)
def _fresh_compile_state():
    C.reset_compile_state()
    yield
    C.reset_compile_state()


def _grads_after_steps(rule_name: str, mode: str, steps: int = 3, batch: int = 16) -> list[torch.Tensor]:
    torch.manual_seed(0)
    x, y = torch.rand(batch, 20), torch.randint(0, 5, (batch,))
    model = MLP("20-12-12-5", "relu", seed=0)
    rule = make_rule(rule_name, {})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with C.compiling(mode):
        for i in range(steps):
            opt.zero_grad()
            rule.backward(model, x, y)
            if i < steps - 1:
                opt.step()
    return [p.grad.clone() for p in model.parameters()]


def _check_equal(rule_name: str) -> None:
    eager = _grads_after_steps(rule_name, "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CompileWarning)   # a fallback would make the comparison vacuous
        graphs = C.compiled_graphs()
        comp = _grads_after_steps(rule_name, "on")
    assert not C.compile_failed()
    assert C.compiled_graphs() > graphs or C.compile_seconds() == 0.0   # compiled now, or cached from before
    for e, c in zip(eager, comp):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=5e-5)


def test_compiled_contrastive_equals_eager():
    _check_equal("contrastive")


@pytest.mark.slow
@pytest.mark.parametrize("rule_name", ["backprop", "fenchel-bp", "eqprop", "lifted-j0", "pc", "lifted-fenchel"])
def test_compiled_rule_equals_eager(rule_name):
    _check_equal(rule_name)


def test_compile_failure_falls_back_with_one_warning(monkeypatch):
    eager = {r: _grads_after_steps(r, "off") for r in ("pc", "backprop")}
    C.reset_compile_state(graphs=True)   # graphs cached by earlier tests would run without compiling

    def broken(*args, **kwargs):
        raise RuntimeError("simulated: no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = {r: _grads_after_steps(r, "on") for r in ("pc", "backprop")}
    compile_warnings = [w for w in caught if issubclass(w.category, C.CompileWarning)]
    assert len(compile_warnings) == 1, [str(w.message) for w in caught]
    assert "simulated" in str(compile_warnings[0].message)
    assert C.compile_failed()
    for r in eager:
        for e, g in zip(eager[r], got[r]):
            assert torch.equal(e, g)


def test_modes_and_devices():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert C.torch_mode("auto", cpu) is None and C.torch_mode("auto", cuda) == "reduce-overhead"
    # auto on CPU: only a whole-batch graph, only for a long run
    assert C.torch_mode("auto", cpu, whole_batch=True) is None
    with C.planned_batches(C.AUTO_CPU_MIN_BATCHES):
        assert C.torch_mode("auto", cpu, whole_batch=True) == "default" and C.torch_mode("auto", cpu) is None
        assert C.torch_mode("off", cpu, whole_batch=True) is None
    with C.planned_batches(C.AUTO_CPU_MIN_BATCHES - 1):
        assert C.torch_mode("auto", cpu, whole_batch=True) is None
    assert C.torch_mode("on", cpu) == "default" and C.torch_mode("on", cuda) == "reduce-overhead"
    assert C.torch_mode("no-cudagraphs", cuda) == "default" and C.torch_mode("off", cuda) is None
    with pytest.raises(ValueError, match="Invalid compile mode"):
        C.check_compile_mode("fast")
    with pytest.raises(ValueError, match="Invalid compile mode"):
        TrainConfig(compile="fast")
    assert C.compile_mode() == "off"
    with C.compiling("on"):
        assert C.compile_mode() == "on"
    assert C.compile_mode() == "off"


def test_train_records_compile_option(tmp_path, monkeypatch, capsys):
    """``--compile`` lands in config.json and metrics carry ``compile_seconds`` (here: compilation fails, so 0)."""
    from inferlearn.cli import main

    monkeypatch.setattr(torch, "compile", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("simulated")))
    out = tmp_path / "run"
    assert main(["train", "--data", "digits", "--arch", "64-16-10", "--rule", "pc", "--epochs", "1",
                 "--limit-train", "120", "--batch-size", "50", "--compile", "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().err.count("torch.compile is unavailable or failed") == 1   # the CLI prints warnings
    assert json.loads((out / "config.json").read_text())["compile"] == "on"
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["compile_seconds"] == 0.0


@pytest.mark.parametrize("threshold,expect", [(1, True), (10 ** 9, False)])
def test_auto_compiles_the_whole_batch_pc_graph_on_cpu_only_for_long_runs(tmp_path, monkeypatch, threshold, expect):
    """``auto`` on CPU: the training loop declares its planned mini-batches and only the whole-batch graph (the
    fused training step: predictive coding's whole inference and the optimiser's update) is compiled, only above
    the threshold (torch.compile stubbed by the identity: the decision, not the compiler, is under test)."""
    from inferlearn.training.loop import train

    names = []

    def stub(fn, **kwargs):
        names.append(fn.__name__)
        return fn

    C.reset_compile_state(graphs=True)
    monkeypatch.setattr(torch, "compile", stub)
    monkeypatch.setattr(C, "AUTO_CPU_MIN_BATCHES", threshold)
    cfg = TrainConfig(data="digits", arch="64-16-10", rule="pc", epochs=1, batch_size=50, limit_train=120,
                      compile="auto", out=str(tmp_path / "run"))
    train(cfg, progress=False, log=None)
    assert names == (["_fused_update"] if expect else [])
    C.reset_compile_state(graphs=True)


def test_compiled_whole_batch_pc_equals_eager_to_1e_6():
    """One batch of predictive coding as one compiled graph (forward pass, T steps, gradient) against the eager
    run of the same function, float32: relative gradient error ≤ 1e-6 (measured 2e-7). Guards against the
    compiled graph reordering or dropping work (a missed step, a stale constant) beyond float32 rounding."""
    torch.manual_seed(0)
    x, y = torch.rand(16, 20), torch.randint(0, 5, (16,))

    def grads(mode):
        model = MLP("20-12-12-5", "relu", seed=0)
        with C.compiling(mode):
            info = make_rule("pc", {}).backward(model, x, y)
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), info

    eager, e_info = grads("off")
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CompileWarning)   # a fallback to eager would make this vacuous
        comp, c_info = grads("on")
    assert not C.compile_failed()
    assert float((comp - eager).norm() / eager.norm()) <= 1e-6
    assert c_info.extras["converged"] == e_info.extras["converged"]
    assert abs(c_info.loss - e_info.loss) <= 1e-6 * abs(e_info.loss)


def test_the_compile_mode_is_an_argument_of_the_call():
    """``rule.backward(..., compile=mode)`` runs the rule's steps in that mode and leaves the enclosing mode as it was;
    a bad mode is refused in one line; the process-wide ``set_compile`` is deprecated."""
    from inferlearn.rules.base import Rule, StepInfo

    seen = []

    class Probe(Rule):
        name = "probe"

        def _backward(self, model, x, labels):
            seen.append(C.compile_mode())
            return StepInfo(0.0, model(x).detach())

    model = nn.Linear(4, 3)
    x, labels = torch.randn(5, 4), torch.randint(0, 3, (5,))
    with C.compiling("off"):
        Probe().backward(model, x, labels, compile="no-cudagraphs")
        Probe().backward(model, x, labels)
        assert C.compile_mode() == "off"
    assert seen == ["no-cudagraphs", "off"]
    with pytest.raises(ValueError, match="Invalid compile mode"):
        Probe().backward(model, x, labels, compile="fast")
    with pytest.warns(DeprecationWarning, match="compiling"):
        old = C.set_compile("off")
    assert old == "off"
