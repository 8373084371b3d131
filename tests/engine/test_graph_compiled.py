"""Compiled paths of the graph engine: predictive coding's value-node step and back-propagation's forward pass
on models that are not dense chains (a residual conv net here), compiled equal to eager.

Oracles: the eager run of the same function (to 1e-6 relative, float32: the compiled graph may only reorder
float32 rounding), and the library's eager path (the closed-form adjoint step on affine maps, a different
algorithm for the same gradient: to float32 tolerance). Each test fails on a fallback to eager (the comparison
would be vacuous) and checks that a graph was compiled.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from graph_models import ResidualConvNet
from inferlearn.engine import compiled as C
from inferlearn.engine.problems import penalty
from inferlearn.engine.problems import LayeredProblem
from inferlearn.errors import ConvergenceWarning
from inferlearn.rules import make_rule
from inferlearn.rules import backprop


@pytest.fixture(autouse=True)
def _fresh_compile_state():
    C.reset_compile_state()
    yield
    C.reset_compile_state()


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 16, generator=g), torch.randint(0, 3, (n,), generator=g)


def _grads(rule, mode: str, steps: int = 2, model_factory=ResidualConvNet) -> tuple[torch.Tensor, list]:
    """Parameter gradients after ``steps`` SGD steps (so the later batches see updated weights), and the infos."""
    torch.manual_seed(0)
    model = model_factory()
    x, y = _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    infos = []
    with C.compiling(mode):
        for i in range(steps):
            opt.zero_grad()
            infos.append(rule.backward(model, x, y))
            if i < steps - 1:
                opt.step()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), infos


def _compiled(rule, step, **kw):
    """``_grads`` compiled, from no compiled graph: fails unless ``step`` (the compiled step under test) compiled."""
    C.reset_compile_state(graphs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CompileWarning)   # a fallback to eager would make the comparison vacuous
        out = _grads(rule, "on", **kw)
    assert not C.compile_failed()
    assert step._graphs, f"{step.name} ran eagerly"
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_compiled_graph_pc_step_equals_eager(monkeypatch):
    """PC (T = 20) on a residual conv net: the compiled value-node step against (1) the eager run of the same
    vector–Jacobian step (the closed form switched off), to 1e-6 relative, with the same verdict and loss, and
    (2) the library's default eager path, the closed-form adjoint step, to float32 tolerance."""
    rule = make_rule("pc", {"steps": 20})
    default_eager, _ = _grads(rule, "off")
    comp, c_infos = _compiled(rule, penalty.PC_GRAPH_STEP)
    with monkeypatch.context() as m:
        m.setattr(LayeredProblem, "_closed_form", lambda self: False)
        eager, e_infos = _grads(rule, "off")
    assert _rel(comp, eager) <= 1e-6
    assert _rel(comp, default_eager) <= 1e-5
    for c, e in zip(c_infos, e_infos):
        assert c.extras["converged"] == e.extras["converged"] and c.extras["inference_steps"] == 20
        assert abs(c.loss - e.loss) <= 1e-6 * abs(e.loss)
        assert abs(c.extras["solver_residual"] - e.extras["solver_residual"]) <= 1e-5 * e.extras["solver_residual"]


@pytest.mark.parametrize("opts", [{"steps": 5, "step_size": 0.1}, {"steps": 4, "step_size": 0.05, "nudging": "symmetric"}])
def test_compiled_epc_error_step_equals_eager(opts):
    """ePC on a residual conv net (clamped, and a nudged output whose per-row nudge scale is a tensor argument): the
    compiled error step gives the eager gradients to 1e-6 relative, the same loss and number of iterations."""
    from inferlearn.engine.problems import error_problem

    rule = make_rule("epc", opts)
    eager, e_infos = _grads(rule, "off")
    comp, c_infos = _compiled(rule, error_problem.EPC_GRAPH_STEP)
    assert _rel(comp, eager) <= 1e-6
    for c, e in zip(c_infos, e_infos):
        assert c.extras["inference_steps"] == e.extras["inference_steps"] == opts["steps"]
        assert abs(c.loss - e.loss) <= 1e-6 * abs(e.loss)


def test_compiled_graph_bp_equals_eager_and_still_checks_labels():
    """Back-propagation on a residual conv net: the compiled forward pass (and its compiled backward) gives the
    eager gradients to 1e-6 relative; a label beyond the output still gets the eager check's message."""
    rule = make_rule("backprop", {})
    eager, e_infos = _grads(rule, "off")
    comp, c_infos = _compiled(rule, backprop.GRAPH_FORWARD)
    assert _rel(comp, eager) <= 1e-6
    assert abs(c_infos[-1].loss - e_infos[-1].loss) <= 1e-6 * e_infos[-1].loss
    x, y = _data()
    with C.compiling("on"), pytest.raises(ValueError, match="Labels out of range: found label 7"):
        rule.backward(ResidualConvNet(), x, torch.full_like(y, 7))


def test_auto_compiles_the_graph_pc_step_on_cpu_for_runs_of_500_batches_and_bp_never():
    """``auto`` on CPU follows ``benchmarks/bench_graph_compile.py``: the graph PC step (faster compiled) from
    :data:`~inferlearn.engine.problems.GRAPH_AUTO_CPU_MIN_BATCHES` planned mini-batches, back-propagation's graph
    forward (slower compiled on two of three models) never; ``on`` compiles both."""
    cpu = torch.device("cpu")
    step, forward = penalty.PC_GRAPH_STEP, backprop.GRAPH_FORWARD
    with C.compiling("auto"):
        with C.planned_batches(penalty.GRAPH_AUTO_CPU_MIN_BATCHES):
            assert step.active(cpu) and not forward.active(cpu)
        with C.planned_batches(penalty.GRAPH_AUTO_CPU_MIN_BATCHES - 1):
            assert not step.active(cpu) and not forward.active(cpu)
    with C.compiling("on"):
        assert step.active(cpu) and forward.active(cpu)
    with C.compiling("off"):
        assert not step.active(cpu) and not forward.active(cpu)
    assert C.torch_mode("auto", cpu, auto_cpu_min_batches=3) is None
    with C.planned_batches(3):
        assert C.torch_mode("auto", cpu, auto_cpu_min_batches=3) == "default"
        assert C.torch_mode("auto", torch.device("cuda"), auto_cpu_min_batches=3) == "reduce-overhead"


@pytest.mark.slow
def test_compiled_graph_pc_step_on_resnet20_equals_eager_in_float64():
    """The zoo's ResNet-20 (width 0.25, 19 value nodes, skip connections with channel padding), PC T = 10:
    compiled against eager, which takes the same vector–Jacobian step here (the padding shortcut is not affine),
    in float64 to 1e-10 relative (measured 3e-14). Not float32 to 1e-6: there this gradient is ill-conditioned,
    so that scaling the input by 1 + 1e-7 (float32 rounding) moves the eager gradient by 7e-6 relative, and
    compiled and eager differ by 1.6e-5."""
    from inferlearn.models.build import build_model

    def grads(mode):
        torch.manual_seed(0)
        model = build_model("resnet20:width=0.25", "relu", 3 * 32 * 32, 10, (3, 32, 32), seed=0).double()
        x, y = torch.rand(8, 3 * 32 * 32, dtype=torch.float64), torch.randint(0, 10, (8,))
        with C.compiling(mode):
            info = make_rule("pc", {"steps": 10}).backward(model, x, y)
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), info

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)   # T = 10 is short for 19 value nodes, by design here
        eager, e_info = grads("off")
        warnings.simplefilter("error", C.CompileWarning)
        C.reset_compile_state(graphs=True)   # so that the check below sees this test's graphs
        comp, c_info = grads("on")
    assert not C.compile_failed() and penalty.PC_GRAPH_STEP._graphs
    assert _rel(comp, eager) <= 1e-10
    assert abs(c_info.loss - e_info.loss) <= 1e-10 * abs(e_info.loss)


@pytest.mark.parametrize("compiled_delay,expect", [(0.02, "eager"), (0.0, "compiled")])
def test_auto_keeps_the_faster_of_compiled_and_eager_by_measuring(monkeypatch, compiled_delay, expect):
    """``measure`` (the graph PC step's ``auto`` on CPU): the compiling call, then eager and compiled in turn,
    ``MEASURE_CALLS`` timed calls each; the faster stays for the shape. ``torch.compile`` is stubbed by a wrapper
    that sleeps ``compiled_delay`` (slower than eager) or by a graph that skips the eager function's sleep (faster):
    the decision, not the compiler, is under test. Every call returns the step's value either way."""
    import time as _time

    def fn(x):
        _time.sleep(0.01)
        return x + 1

    def fake_compile(f, **kw):
        return (lambda x: (_time.sleep(compiled_delay), x + 1)[1]) if compiled_delay else (lambda x: x + 1)

    monkeypatch.setattr(torch, "compile", fake_compile)
    step = C.CompiledStep(fn, "a measured step", auto_cpu_min_batches=1, measure=True)
    x = torch.zeros(3)
    with C.compiling("auto"), C.planned_batches(1):
        outs = [step(x) for _ in range(1 + 2 * C.MEASURE_CALLS + 2)]
        assert all(torch.equal(o, x + 1) for o in outs)
        (ratio,) = step.measured.values()
        assert (ratio >= 1.0) == (expect == "eager")
        assert C.compile_decisions() == [f"a measured step: compiled took {ratio:.2f}x eager's time, kept {expect}"]
        assert (step.resolved(x) is fn) == (expect == "eager")
    with C.compiling("on"):   # 'on' compiles without measuring: a separate decision
        step(x)
        assert step.resolved(x) is not fn


@pytest.mark.parametrize("compiled_delay", [0.0, 0.05])
def test_a_choice_kept_by_an_earlier_run_in_the_process_is_recorded_and_a_replayed_one_wins(monkeypatch, compiled_delay):
    """Runs one after another in one process (a benchmark's search, then its final runs) share the steps' kept
    graphs: a later run does not measure again, and must still record the choice it runs with (its checkpoints
    carry it, so that resuming it in a new process does not measure again); a replayed choice (--resume) decides
    over a graph kept by an earlier run."""
    import time as _time

    def fn(x):
        _time.sleep(0.01)
        return x + 1

    monkeypatch.setattr(torch, "compile", lambda f, **kw: (
        lambda x: (_time.sleep(compiled_delay), x + 1)[1]) if compiled_delay else (lambda x: x + 1))
    step = C.CompiledStep(fn, "a step measured once", auto_cpu_min_batches=1, measure=True)
    x = torch.zeros(3)
    C.reset_compile_state(graphs=True)
    with C.compiling("auto"), C.planned_batches(1):
        for _ in range(1 + 2 * C.MEASURE_CALLS + 1):
            step(x)
        first = C.measured_choices()
        assert first == {step.name: compiled_delay == 0.0}
        C.replay_choices({})   # the next run of the process starts with no choice (the training loop does this)
        step(x)
        assert C.measured_choices() == first and C.compile_decisions()[1:] == []
        C.replay_choices({step.name: not first[step.name]})   # a resumed run's recorded choice decides
        assert torch.equal(step(x), x + 1)
        assert (step.resolved(x) is fn) == first[step.name]


def test_auto_measured_choice_is_recorded_and_replayed_without_measuring_again():
    """A resumed run must take the choice the interrupted one measured (compiled and eager round differently, and a
    new measurement may choose otherwise): ``measured_choices`` records it by step name (the checkpoint keeps it),
    ``replay_choices`` makes the step take it without a trial."""
    from inferlearn.engine.problems import error_problem

    step = error_problem.EPC_GRAPH_STEP
    rule = make_rule("epc", {"steps": 5})
    x, y = _data()
    model = ResidualConvNet()
    C.reset_compile_state(graphs=True)
    with C.compiling("auto"), C.planned_batches(1000):
        for _ in range(3):   # 15 steps: the trial's 3 eager and 3 compiled calls, then the kept one
            rule.backward(model, x, y)
    choices = C.measured_choices()
    assert step.name in choices and len(C.compile_decisions()) == 1
    for keep in (False, True):
        C.reset_compile_state(graphs=True)
        C.replay_choices({step.name: keep})
        with C.compiling("auto"), C.planned_batches(1000):
            rule.backward(ResidualConvNet(), x, y)
        assert not step._trials and C.compile_decisions() == []   # no new measurement
        assert bool(step._graphs) and all((g is step.fn) != keep for g in step._graphs.values())
        assert C.compiled_graphs() == (1 if keep else 0)
