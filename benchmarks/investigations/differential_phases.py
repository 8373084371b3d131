"""Differential against direct phases: float32 gradients of contrastive learning and EqProp by signal size, and cost.

The two-phase rules divide a difference of two equilibria by its signal (``γ^{L-1}``, ``β γ^{L-1}``). Solved
directly, each phase's O(1) activations carry their own round-off and the solver's absolute tolerance;
solved differentially (``phases="differential"``, :mod:`inferlearn.engine.differential`), the second phase is
found as its difference ``δ`` from the free minimiser, to a tolerance relative to ``δ``.

For MLPs 30-20×H-5 (ReLU, seed 0) on a random batch of 64, this reports the relative error
``‖g − g_ref‖ / ‖g_ref‖`` of the whole float32 gradient, direct and differential, against the float64 rule
solved differentially to a relative tolerance of 1e-10 with the float64 reference solver's free phase
(``ref``); whether a ``PrecisionWarning`` fired; and the CPU time of one differential step over one direct
step (median of 7, one thread) on Table 3's network 784-64×5-10, batch 50.

Run::

    OMP_NUM_THREADS=1 python benchmarks/investigations/differential_phases.py

Writes ``benchmarks/results/differential_phases.md``.
"""
from __future__ import annotations

import copy
import statistics
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

import inferlearn.engine.differential as differential  # noqa: E402
from inferlearn.errors import PrecisionWarning  # noqa: E402
from inferlearn.models import MLP  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "differential_phases.md"
CASES = [(3, 1 / 8), (5, 1 / 16), (5, 1 / 32), (5, 1 / 64), (7, 1 / 16)]
RULES = [("contrastive", {}), ("eqprop", {"beta": 0.1}), ("eqprop", {"beta": 1e-3, "nudging": "positive"}),
         ("eqprop", {"beta": 1e-6})]


def grads(rule, model, x, labels) -> tuple[torch.Tensor, bool]:
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rule.backward(model, x, labels)
    warned = any(issubclass(w.category, PrecisionWarning) for w in caught)
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()]), warned


def reference(name, opts, model, x, labels) -> torch.Tensor:
    old, differential.RELATIVE_TOL = differential.RELATIVE_TOL, 1e-10
    try:
        return grads(make_rule(name, opts | {"solver": "reference", "phases": "differential"}),
                     copy.deepcopy(model).double(), x.double(), labels)[0]
    finally:
        differential.RELATIVE_TOL = old


def step_cost(name: str, opts: dict) -> float:
    """CPU seconds of one differential step over one direct step on 784-64×5-10, batch 50 (median of 7)."""
    torch.set_num_threads(1)
    model = MLP("784-64-64-64-64-64-10", "relu", seed=0)
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(50, 784, generator=g), torch.randint(0, 10, (50,), generator=g)
    times = {"direct": [], "differential": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(7):
            for phases in times:
                rule = make_rule(name, opts | {"phases": phases})
                rule.backward(model, x, labels)
                t = time.process_time()
                for _ in range(5):
                    rule.backward(model, x, labels)
                times[phases].append(time.process_time() - t)
    return statistics.median(times["differential"]) / statistics.median(times["direct"])


def main() -> None:
    start = time.time()
    gen = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 30, generator=gen), torch.randint(0, 5, (64,), generator=gen)
    rows = []
    for hidden, gamma in CASES:
        model = MLP([30] + [20] * hidden + [5], "relu", seed=0)
        for name, extra in RULES:
            opts = {"gamma": gamma, **extra}
            ref = reference(name, opts, model, x, labels)
            cells = []
            for phases in ("direct", "differential"):
                g, warned = grads(make_rule(name, opts | {"phases": phases}), model, x, labels)
                err = float((g - ref).norm() / ref.norm())
                cells.append(f"{err:.1e}{' (warns)' if warned else ''}")
            signal = gamma ** hidden * extra.get("beta", 1.0)
            label = name + "".join(f", {k}={v:g}" if isinstance(v, float) else f", {k}={v}" for k, v in extra.items())
            rows.append(f"| {hidden} | 1/{round(1 / gamma)} | {label} | {signal:.1e} | {cells[0]} | {cells[1]} |")
    costs = [f"| {name} | {step_cost(name, extra):.2f} |" for name, extra in [("contrastive", {}), ("eqprop", {"beta": 0.1})]]
    text = f"""# Differential against direct phases (float32)

Made by `OMP_NUM_THREADS=1 python benchmarks/investigations/differential_phases.py` ({(time.time() - start) / 60:.1f} min).

Relative error of the float32 gradient (all parameters) against the float64 rule solved differentially to a
relative tolerance of 1e-10; MLP 30-20×H-5, ReLU, seed 0, a random batch of 64; default options otherwise
(free phase: block projected gradient, tolerance 1e-5). Signal = γ^(L−1) (× β for EqProp). "(warns)": a
`PrecisionWarning` fired. The default, `phases="auto"`, is differential below a signal of 1000 ε (1.2e-4 in
float32) or 10× the solver tolerance, direct above (it is faster there, and within 1 %).

| hidden H | γ | rule | signal | direct | differential |
|---|---|---|---|---|---|
""" + "\n".join(rows) + """

CPU time of one step, differential over direct (Table 3's network 784-64×5-10, batch 50, one thread, median
of 7 × 5 steps):

| rule | differential / direct |
|---|---|
""" + "\n".join(costs) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
