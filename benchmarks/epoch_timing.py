"""Shared timing harness: one training epoch per rule, interleaved repeats, in one process.

Machines here are shared and noisy, so every rule is timed in the same process, rules are
interleaved within each repeat (a slow moment hits all of them), and we report the median over
repeats and its ratio to back-propagation's median.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch


from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.training.loop import build, epoch_metrics, run_epoch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def time_rules(base: TrainConfig, variants: list[tuple[str, str, dict]], repeats: int = 3,
               evaluate: bool = True) -> list[dict]:
    """Time one epoch of each ``(label, rule, options)`` from the same initial weights.

    Each repeat starts every variant from the seed's initial weights and trains one epoch on the
    same batches. Returns one row per variant with ``median_s``, ``ratio`` (to the first variant,
    which should be back-propagation), ``extras`` (the mean numeric ``StepInfo.extras`` of the first repeat's
    batches: sweep and step counts) and, if ``evaluate``, the test accuracy after the first epoch.
    """
    times: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    acc: dict[str, float] = {}
    extras: dict[str, dict] = {label: {} for label, _, _ in variants}
    for rep in range(repeats):
        for label, rule, options in variants:
            s = build(base.replace(rule=rule, rule_options=options))
            if rep == 0:
                _record_extras(s.rule, extras[label])
            t0 = time.perf_counter()
            run_epoch(s, base.replace(rule=rule), 1, progress=False)
            times[label].append(time.perf_counter() - t0)
            if rep == 0:
                n = extras[label].pop("_batches", 0)
                extras[label] = {k: v / n for k, v in extras[label].items()} if n else {}
            if evaluate and rep == 0:
                acc[label] = epoch_metrics(s, 1, 0.0, 0.0)["test_acc"]
    ref = statistics.median(times[variants[0][0]])
    return [{"label": label, "rule": rule, "options": options, "median_s": statistics.median(times[label]),
             "ratio": statistics.median(times[label]) / ref, "times": times[label], "test_acc": acc.get(label),
             "extras": extras[label]}
            for label, rule, options in variants]


def _record_extras(rule, sums: dict) -> None:
    """Sum the numeric ``StepInfo.extras`` of every ``rule.backward`` call into ``sums`` (``_batches`` counts them)."""
    backward = rule.backward

    def recorded(*args, **kwargs):
        info = backward(*args, **kwargs)
        sums["_batches"] = sums.get("_batches", 0) + 1
        for k, v in info.extras.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums[k] = sums.get(k, 0.0) + v
        return info

    rule.backward = recorded


def multiply_add_floor(rule: str, options: dict, sizes: list[int], extras: dict) -> float | None:
    """A rule's multiply-adds per sample on a dense chain ``n_0 … n_L``, divided by back-propagation's; ``None``
    for a rule this does not count. With ``Σ = Σ_k n_k n_{k+1}`` and ``Σ₁ = Σ − n_0 n_1`` (the input is fixed, so
    the first layer takes part in the forward pass and the weight gradient only):

    - back-propagation, Fenchel BP: forward ``Σ``, weight gradients ``Σ``, data gradients ``Σ₁``: ``2Σ + Σ₁``;
    - predictive coding, ``T`` steps: forward ``Σ``, each step the predictions and their adjoint ``2Σ₁``, then the
      final predictions and the weight gradients: ``2Σ + (2T + 1)Σ₁``;
    - contrastive, ``S`` block sweeps of the stacked free and clamped rows (each sweep a product and an adjoint
      product per layer above the first, for 2 rows): ``Σ + 4SΣ₁``, then the gradient of the difference (the
      first layer once, ``n_0 n_1``; the others for both rows, ``2Σ₁``);
    - EqProp with symmetric nudging, ``S_f`` free sweeps, ``S_n`` sweeps of the two stacked nudged phases:
      ``Σ + 2S_fΣ₁ + 4S_nΣ₁ + n_0 n_1 + 2Σ₁``.

    ``extras``: the rule's mean ``StepInfo.extras`` over the timed epoch (``solver_iterations``,
    ``free_solver_iterations``, ``inference_steps``): the measured sweep and step counts.
    """
    total = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    first = sizes[0] * sizes[1]
    upper = total - first
    bp = 2 * total + upper
    if rule in ("backprop", "fenchel-bp"):
        cost = bp
    elif rule == "pc" and options.get("nudging", "clamp") == "clamp":
        cost = 2 * total + (2 * extras.get("inference_steps", 20) + 1) * upper
    elif rule == "contrastive":
        cost = total + first + (4 * extras["solver_iterations"] + 2) * upper
    elif rule == "eqprop" and options.get("nudging", "symmetric") == "symmetric":
        cost = total + first + (2 * extras["free_solver_iterations"] + 4 * extras["solver_iterations"] + 2) * upper
    else:
        return None
    return cost / bp


def markdown_table(rows: list[dict], extra: tuple[str, str] | None = None) -> str:
    """The rows as a Markdown table; ``extra = (heading, key)`` adds a column after the ratio."""
    head = "| variant | rule | options | epoch time / first row (median) |" + (f" {extra[0]} |" if extra else "")
    lines = [head + " median epoch (s) | test acc after 1 epoch |", "|---|---|---|---|" + ("---|" if extra else "")
             + "---|---|"]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "—"
        acc = f"{r['test_acc']:.4f}" if r["test_acc"] is not None else "—"
        more = f" {r[extra[1]]} |" if extra else ""
        lines.append(f"| {r['label']} | {r['rule']} | {opts} | {r['ratio']:.2f} |{more} {r['median_s']:.2f} | {acc} |")
    return "\n".join(lines) + "\n"


def environment() -> str:
    import platform

    return (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), Python {platform.python_version()}, "
            f"{platform.machine()}")
