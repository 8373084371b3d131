"""Train several rules from the same initial weights and tabulate them side by side.

Every rule gets the same data, architecture, seed (hence the same initial weights and batch order)
and optimiser; the learning rate is ``lrs[rule]`` if given, else ``base.lr``, else (``base.lr = None``) the
rule's own recommended rate (:attr:`inferlearn.rules.Rule.recommended_lr`). The table reports train/test accuracy,
the share of active non-linearities, the epoch-time ratio to back-propagation (median over epochs)
and the mean cosine between the rule's weight gradients and back-propagation's on a fixed batch at
the rule's final weights.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from ..atomic import write_json, write_text
from ..data.transforms import resolve_standardize
from .config import TrainConfig
from ..diagnostics import gradient_alignment, mean_weight_alignment
from ..plots import plot_curves
from ..rules import RULES, make_rule
from ..errors import RunFolderError
from .loop import build, train
from .run_folder import RunFolder

REFERENCE = "backprop"


def parse_rule_options(items: list[str]) -> dict[str, dict]:
    """``["contrastive.gamma=1/8", "eqprop.beta=0.1"]`` → ``{"contrastive": {"gamma": "1/8"}, ...}``; a key given twice
    is refused (``ValueError``), not decided by the last one."""
    out: dict[str, dict] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        rule, dot, opt = key.partition(".")
        if not sep or not dot or not opt:
            raise ValueError(f"Invalid rule option {item!r}: expected RULE.KEY=VALUE, e.g. contrastive.gamma=1/8")
        if rule not in RULES:
            raise ValueError(f"Unknown rule {rule!r} in option {item!r}; choose one of {sorted(RULES)}")
        if opt in out.get(rule, {}):
            raise ValueError(f"Rule option {opt!r} of {rule} given twice ({opt}={out[rule][opt]} and {opt}={value}); "
                             "give it once")
        out.setdefault(rule, {})[opt] = value
    return out


def compare_rules(base: TrainConfig, rules: list[str], options: dict[str, dict] | None = None,
                  lrs: dict[str, float] | None = None, progress: bool = True, log=print,
                  overwrite: bool = False, command: str | None = None) -> list[dict]:
    """Train each rule (back-propagation always included, as the reference) and write the results.

    Runs that exist in ``base.out`` are resumed (and extended to ``base.epochs``); ``overwrite`` starts
    every run afresh instead.

    Writes ``<out>/<rule>/...`` run folders, ``<out>/comparison.md`` (headed by ``command``, the command line
    that makes it, when given), ``comparison.json`` and ``curves.png``.

    Returns:
        one row per rule with the table's columns.
    """
    options, lrs = options or {}, lrs or {}
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise ValueError(f"Unknown rules {unknown}; choose from {sorted(RULES)}")
    rules = [REFERENCE] + [r for r in dict.fromkeys(rules) if r != REFERENCE]
    for name in rules:   # every rule's options are checked before the first one trains
        make_rule(name, options.get(name, {}))
    with RunFolder(base.out) as top:   # locked while the comparison runs
        if top.holds_run():   # a comparison keeps its runs in subfolders: this is another command's run
            if not overwrite:
                raise RunFolderError(f"{top.path} holds another run (not a comparison); choose another --out for "
                                     "the comparison, or --overwrite to replace that run")
            top.refuse_overwrite(True)
        return _compare(base, rules, options, lrs, progress, log, overwrite, command)


def _compare(base: TrainConfig, rules: list[str], options: dict[str, dict], lrs: dict[str, float], progress: bool,
             log, overwrite: bool, command: str | None = None) -> list[dict]:
    out = Path(base.out)
    histories, rows = {}, []
    for name in rules:
        if log:
            log(f"== {name}")
        cfg = base.replace(rule=name, rule_options=options.get(name, {}), lr=lrs.get(name, base.lr), out=str(out / name),
                           tensorboard=None if base.tensorboard is None else str(Path(base.tensorboard) / name)).resolved()
        histories[name] = train(cfg, progress=progress, resume=not overwrite, log=log, overwrite=overwrite)
        rows.append(_row(cfg, histories[name]))
    ref_time = rows[0]["epoch_seconds"]
    for row in rows:
        row["time_ratio"] = row["epoch_seconds"] / ref_time if ref_time > 0 else float("nan")
    write_json({"config": base.to_dict(), "rules": rows}, out / "comparison.json")
    write_text(format_table(base, rows, command), out / "comparison.md")
    plot_curves(histories, out / "curves.png", title=f"{base.data} {base.arch} {base.act}")
    return rows


def _row(cfg: TrainConfig, history: list[dict]) -> dict:
    last = history[-1]
    setup = build(cfg)
    state = torch.load(Path(cfg.out) / "checkpoint.pt", map_location=cfg.device, weights_only=False)
    setup.model.load_state_dict(state["model"])
    n = min(256, setup.train_x.shape[0])
    rule = make_rule(cfg.rule, cfg.rule_options)
    align = mean_weight_alignment(gradient_alignment(rule, setup.model, setup.train_x[:n], setup.train_y[:n]))
    return {"rule": cfg.rule, "options": cfg.rule_options, "lr": cfg.lr, "epochs": last["epoch"],
            "train_acc": last["train_acc"], "test_acc": last["test_acc"], "active_fraction": last["active_fraction"],
            "epoch_seconds": statistics.median(r["epoch_seconds"] for r in history), "alignment": align}


def format_table(base: TrainConfig, rows: list[dict], command: str | None = None) -> str:
    """The comparison as a Markdown table, with the command (if given) and its settings above it."""
    lr = f"lr {base.lr}" if base.lr is not None else "each rule's recommended lr"
    head = (f"Data `{base.data}`, architecture `{base.arch}`, units `{base.act}`, {base.optimizer} {lr}, "
            f"batch {base.batch_size}, seed {base.seed}, epochs {rows[0]['epochs'] if rows else 0}"
            + (f", first {base.limit_train} training samples" if base.limit_train else "") + _recipe(base) + ".\n\n")
    lines = ["| rule | options | lr | train acc | test acc | active non-lin. | epoch time / BP | grad. cosine with BP |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "—"
        lines.append(f"| {r['rule']} | {opts} | {r['lr']:g} | {r['train_acc']:.4f} | {r['test_acc']:.4f} | {r['active_fraction']:.3f} | "
                     f"{r['time_ratio']:.2f} | {r['alignment']:.3f} |")
    note = ("\nEpoch time: median over epochs, ratio to back-propagation in the same process. Gradient cosine: mean "
            "over weight matrices, on the first 256 training samples at the rule's final weights.\n")
    made = f"Made by `{command}`.\n\n" if command else ""
    return made + head + "\n".join(lines) + "\n" + note


def _recipe(base: TrainConfig) -> str:
    """The settings of the input pipeline and optimiser that differ from plain training, for the table's header."""
    parts = [f"weight decay {base.weight_decay:g}" if base.weight_decay else "",
             f"lr schedule {base.lr_schedule}" if base.lr_schedule != "constant" else "",
             "inputs standardised per channel" if resolve_standardize(base.standardize, base.data) == "on" else "",
             f"{base.augment} augmentation" if base.augment != "none" else ""]
    return "".join(f", {p}" for p in parts if p)


def load_rows(folder: str | Path) -> list[dict]:
    """Rows of a finished comparison."""
    return json.loads((Path(folder) / "comparison.json").read_text())["rules"]
