"""Shared timing harness: one training epoch per rule, interleaved repeats, in one process.

Machines here are shared and noisy, so every rule is timed in the same process, rules are
interleaved within each repeat (a slow moment hits all of them), and we report the median over
repeats and its ratio to back-propagation's median.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.training.loop import build, epoch_metrics, run_epoch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def time_rules(base: TrainConfig, variants: list[tuple[str, str, dict]], repeats: int = 3,
               evaluate: bool = True) -> list[dict]:
    """Time one epoch of each ``(label, rule, options)`` from the same initial weights.

    Each repeat starts every variant from the seed's initial weights and trains one epoch on the
    same batches. Returns one row per variant with ``median_s``, ``ratio`` (to the first variant,
    which should be back-propagation) and, if ``evaluate``, the test accuracy after the first epoch.
    """
    times: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    acc: dict[str, float] = {}
    for rep in range(repeats):
        for label, rule, options in variants:
            s = build(base.replace(rule=rule, rule_options=options))
            t0 = time.perf_counter()
            run_epoch(s, base.replace(rule=rule), 1, progress=False)
            times[label].append(time.perf_counter() - t0)
            if evaluate and rep == 0:
                acc[label] = epoch_metrics(s, 1, 0.0, 0.0)["test_acc"]
    ref = statistics.median(times[variants[0][0]])
    return [{"label": label, "rule": rule, "options": options, "median_s": statistics.median(times[label]),
             "ratio": statistics.median(times[label]) / ref, "times": times[label], "test_acc": acc.get(label)}
            for label, rule, options in variants]


def markdown_table(rows: list[dict]) -> str:
    lines = ["| variant | rule | options | epoch time / first row (median) | median epoch (s) | test acc after 1 epoch |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "—"
        acc = f"{r['test_acc']:.4f}" if r["test_acc"] is not None else "—"
        lines.append(f"| {r['label']} | {r['rule']} | {opts} | {r['ratio']:.2f} | {r['median_s']:.2f} | {acc} |")
    return "\n".join(lines) + "\n"


def environment() -> str:
    import platform

    return (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), Python {platform.python_version()}, "
            f"{platform.machine()}")
