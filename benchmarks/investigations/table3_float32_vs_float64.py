"""Table 3 (ReLU, contrastive at γ = 1/16) in float32 with differential phases, epoch by epoch against float64.

Directly solved, the contrastive signal γ^(L−1) = 1/16⁵ ≈ 1e-6 drowned in float32 round-off and the run
collapsed (`lifted_small_gamma/table3_gamma1-16`, 0.230 test at epoch 20); in float64 it trained to 0.950 /
0.878 (`table3_gamma1-16_float64`). With differential phases (the default `phases="auto"` picks them at this
signal) the float32 run is made by::

    inferlearn reproduce lifted --table 3 --epochs 100 --acts relu --rows contrastive --gamma 1/16 --lr 0.05 \\
        --batch-size 50 --seed 0 --out benchmarks/results/lifted_small_gamma/table3_gamma1-16_float32

This script compares the three runs' metrics and writes
``benchmarks/results/lifted_small_gamma/table3_float32_vs_float64.md`` and ``.png``::

    python benchmarks/investigations/table3_float32_vs_float64.py
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "lifted_small_gamma"
RUNS = {"float64 (direct)": ROOT / "table3_gamma1-16_float64" / "relu" / "contrastive",
        "float32, differential phases": ROOT / "table3_gamma1-16_float32" / "table3" / "relu" / "contrastive",
        "float32, direct phases (before)": ROOT / "table3_gamma1-16" / "relu" / "contrastive"}


def load(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> None:
    runs = {name: load(folder) for name, folder in RUNS.items()}
    f64, f32 = runs["float64 (direct)"], runs["float32, differential phases"]
    n = min(len(f64), len(f32))
    lines = ["# Table 3, ReLU, contrastive at γ = 1/16: float32 (differential phases) against float64", "",
             "Made by `python benchmarks/investigations/table3_float32_vs_float64.py` from the runs' `metrics.jsonl`",
             "(commands in the script's docstring). Fashion-MNIST, 784-64×5-10, SGD η = 0.05, batch 50, seed 0; the",
             "same initial weights in every run.", "",
             f"Epochs compared: {n}. Largest |Δ test accuracy| (float32 − float64) over them: "
             f"{max(abs(a['test_acc'] - b['test_acc']) for a, b in zip(f32[:n], f64[:n])):.4f}; "
             f"largest |Δ train accuracy|: {max(abs(a['train_acc'] - b['train_acc']) for a, b in zip(f32[:n], f64[:n])):.4f}.",
             "", "| epoch | float64 train | float64 test | float32 train | float32 test | float32 direct (before) test |",
             "|---|---|---|---|---|---|"]
    before = runs["float32, direct phases (before)"]
    for e in sorted({1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, n} & set(range(1, n + 1))):
        b = f"{before[e - 1]['test_acc']:.4f}" if e <= len(before) else "stopped"
        lines.append(f"| {e} | {f64[e - 1]['train_acc']:.4f} | {f64[e - 1]['test_acc']:.4f} | "
                     f"{f32[e - 1]['train_acc']:.4f} | {f32[e - 1]['test_acc']:.4f} | {b} |")
    out = ROOT / "table3_float32_vs_float64.md"
    out.write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, rows in runs.items():
        if rows:
            ax.plot([r["epoch"] for r in rows], [r["test_acc"] for r in rows], label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("Table 3, ReLU, contrastive, γ = 1/16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
