"""Contrastive training at the tables' γ = 1/8 against a smaller γ and back-propagation, from committed runs.

Reads the per-epoch metrics that ``inferlearn reproduce lifted`` wrote (the tables at γ = 1/8 in
``results/lifted_table{N}/`` and the smaller-γ reruns in ``results/lifted_small_gamma/``) and draws, per
table and unit type, the training loss and test accuracy of back-propagation, contrastive at γ = 1/8 and
contrastive at the smaller γ. Writes ``results/lifted_small_gamma/curves.png`` and ``summary.md``
(final and best test accuracy, lowest training loss and its epoch). Run::

    python benchmarks/plot_lifted_gamma.py
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = RESULTS / "lifted_small_gamma"
#: per table, the smaller-γ reruns: (folder under lifted_small_gamma/, label)
RUNS = [(2, [("table2_gamma1-32", "γ = 1/32")]),
        (3, [("table3_gamma1-16", "γ = 1/16"), ("table3_gamma1-16_float64", "γ = 1/16, float64")]),
        (4, [("table4_gamma1-32", "γ = 1/32")])]
ACTS = ("relu", "hard-sigmoid")


def metrics(folder: Path) -> list[dict] | None:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else None


def main():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, reruns, act) for t, reruns in RUNS for act in ACTS]
    fig, axes = plt.subplots(2, len(panels), figsize=(3.2 * len(panels), 6), squeeze=False)
    lines = ["# Contrastive training at a smaller γ", "",
             "Command: `python benchmarks/plot_lifted_gamma.py` (reads the committed runs; each table's own file "
             "gives the command that trained it).", "",
             "| table | units | method | epochs | final test | best test (epoch) | lowest train loss (epoch) | final train loss |",
             "|---|---|---|---|---|---|---|---|"]
    for j, (t, reruns, act) in enumerate(panels):
        runs = {"back-propagation": metrics(RESULTS / f"lifted_table{t}" / act / "backprop"),
                "contrastive γ = 1/8": metrics(RESULTS / f"lifted_table{t}" / act / "contrastive")}
        runs |= {f"contrastive {label}": metrics(SMALL / sub / act / "contrastive") for sub, label in reruns}
        for name, m in runs.items():
            if not m:
                continue
            ep = [r["epoch"] for r in m]
            axes[0][j].semilogy(ep, [r["train_loss"] for r in m], label=name)
            axes[1][j].plot(ep, [r["test_acc"] for r in m], label=name)
            best = max(m, key=lambda r: r["test_acc"])
            low = min(m, key=lambda r: r["train_loss"])
            lines.append(f"| {t} | {act} | {name} | {len(m)} | {m[-1]['test_acc']:.4f} | {best['test_acc']:.4f} ({best['epoch']}) | "
                         f"{low['train_loss']:.4f} ({low['epoch']}) | {m[-1]['train_loss']:.4f} |")
        axes[1][j].legend(fontsize=6)
        axes[0][j].set_title(f"Table {t}, {act}", fontsize=9)
        axes[1][j].set_xlabel("epoch")
        for ax in (axes[0][j], axes[1][j]):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("train loss (quadratic)")
    axes[1][0].set_ylabel("test accuracy")
    fig.tight_layout()
    SMALL.mkdir(parents=True, exist_ok=True)
    fig.savefig(SMALL / "curves.png", dpi=100)
    (SMALL / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
