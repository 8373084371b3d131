"""The benchmark's tables: ``results.json``, ``results.md`` and ``results.png`` of a benchmark folder, with both
reporting protocols (ours: the last epoch over all seeds; PCX's: the best epoch over the best K − 2 of K seeds) and
the peer's column (``pcx.json``, written by ``benchmarks/peers/bench_pcx_conv.py``)."""
from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path

import numpy as np

from ..atomic import write_json, write_text
from ..data import load_dataset
from ..training.config import TrainConfig
from .protocols import Protocol, scaled_arch, scaled_epochs
from .settings import Settings, point_name


def header(protocol: Protocol, settings: Settings, command: str, data_line: str) -> list[str]:
    """What every output of a benchmark says first: protocol, budget, data copy, device and the exact command."""
    arch = scaled_arch(protocol.arch, settings.budget.width)
    epochs = scaled_epochs(int(protocol.train.get("epochs", TrainConfig().epochs)), settings.budget.epochs)
    return [f"# Benchmark `{protocol.name}`", "", protocol.summary, "",
            f"- **Budget:** {settings.budget.label}: `--arch {arch}`, {epochs} epoch{'s' if epochs != 1 else ''}",
            f"- **Data:** {data_line}",
            f"- **Device:** {settings.device}",
            f"- **Command:** `{command}`",
            f"- **Search:** on the last {protocol.val_size} training images (a validation split), "
            f"{protocol.search_seeds} seed(s) per point, choosing the highest validation accuracy of the "
            f"{'last' if protocol.select == 'last' else 'best'} epoch; **final runs** on the full training split, "
            f"seeds 0–{settings.seeds - 1}", ""]


def data_line(data) -> str:
    """Which copy of the data the runs read: its source and whether its checksums are the published ones."""
    if data.meta.get("unverified_files"):
        return (f"`{data.name}` from {data.source} — an UNVERIFIED copy (--allow-unverified; its checksums differ "
                "from the published files: for colour CIFAR-10 the lossy JPEG-derived development copy). Numbers on "
                "it are close to, not equal to, those on the published data set")
    check = "checksums verified against the published files" if data.name != "digits" else "scikit-learn's copy"
    return f"`{data.name}` from {data.source} ({check})"


def completeness(results: dict) -> tuple[int, int]:
    """How much a results table holds: ``(final runs finished or diverged, rows decided)`` (a skipped row counts as
    decided)."""
    rows = results.get("variants") or []
    finals = sum(1 for r in rows for f in r.get("finals", []) if "test_acc" in f or "diverged" in f)
    return finals, sum(1 for r in rows if r.get("finals") or r.get("skipped"))


def write_results(protocol: Protocol, settings: Settings, command: str, rows: list[dict], running: str | None = None) -> dict:
    """Write ``results.json``, ``results.md`` and ``results.png`` for the variants in ``rows`` (``running``: the
    variant whose final runs are under way; its row holds the seeds so far). A table is only ever replaced by one
    that holds at least as much (:func:`completeness`): a rerun cut short, or one of fewer ``--variants``, writes
    ``results.partial.md`` / ``.json`` instead, and ``results["written"]`` names what was written."""
    with warnings.catch_warnings():   # an unverified copy: the runs warned, and the data line says so
        warnings.simplefilter("ignore")
        data = load_dataset(protocol.data, settings.data_dir, allow_unverified=settings.allow_unverified)
    results = results_of(protocol, settings, command, rows, data_line(data))
    results["complete"] = len(rows) == len(protocol.variants) and running is None
    results["running"] = running
    out = Path(settings.out)
    stem = "results"
    try:
        old = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and completeness(old) > completeness(results):
        stem = "results.partial"
    results["written"] = str(out / f"{stem}.md")
    write_json(results, out / f"{stem}.json")
    write_text(format_results(protocol, settings, results), out / f"{stem}.md")
    if stem == "results":
        _plot(results, out / "results.png")
        for name in ("results.partial.md", "results.partial.json"):   # superseded by the table just written
            (out / name).unlink(missing_ok=True)
    return results


def pcx_protocol(best: list) -> dict | None:
    """PCX's reporting (Pinchetti et al. 2024): each seed's best test accuracy over the epochs, averaged over the
    best ``K − 2`` of ``K`` seeds (its 5 of 7; all of them for ``K ≤ 2``). ``None`` when a seed's best is unknown (a
    run recorded before the benchmark kept it)."""
    if not best or any(b is None for b in best):
        return None
    keep = sorted(best, reverse=True)[:max(1, len(best) - 2) if len(best) > 2 else len(best)]
    return {"mean": float(np.mean(keep)), "std": float(np.std(keep, ddof=0)), "kept": len(keep), "of": len(best)}


def summarise(row: dict) -> None:
    ok = [f for f in row["finals"] if "test_acc" in f]
    accs = np.array([f["test_acc"] for f in ok], dtype=float)
    row["n_seeds"], row["n_diverged"] = len(ok), len(row["finals"]) - len(ok)
    row["test_acc_mean"] = float(np.mean(accs)) if len(ok) else None
    row["test_acc_std"] = float(np.std(accs, ddof=0)) if len(ok) else None
    row["pcx_protocol"] = pcx_protocol([f.get("best_test_acc") for f in ok])
    times = [t for f in ok for t in f["epoch_seconds"]]
    row["epoch_seconds"] = float(statistics.median(times)) if times else None


def results_of(protocol: Protocol, settings: Settings, command: str, rows: list[dict], data: str) -> dict:
    base = next((r for r in rows if r["variant"] == protocol.baseline), None)
    ref_time = base.get("epoch_seconds") if base else None
    for r in rows:
        t = r.get("epoch_seconds")
        r["time_ratio"] = t / ref_time if t is not None and ref_time else None
        ref = protocol.reference(r["variant"])
        r["reference"] = None if ref is None else {"test_acc": ref.test_acc, "note": ref.note}
    return {"protocol": protocol.name, "summary": protocol.summary, "budget": settings.budget.label,
            "budget_width": settings.budget.width, "budget_epochs": settings.budget.epochs, "data": data,
            "device": settings.device, "command": command, "select": protocol.select, "seeds": settings.seeds,
            "val_size": protocol.val_size, "search_seeds": protocol.search_seeds, "baseline": protocol.baseline,
            "reused_from": settings.reuse, **peer_results(Path(settings.out) / PEER_FILE),
            "reference_source": protocol.source, "notes": protocol.notes, "variants": rows}


#: the peer's results in a benchmark folder (written by ``benchmarks/peers/bench_pcx_conv.py``)
PEER_FILE = "pcx.json"


def peer_results(path: Path) -> dict:
    """``{"peer": {variant: {"test_acc": [...], "best_test_acc": [...], "epoch_seconds": [...]}}, "peer_commands":
    [...]}`` from a benchmark folder's ``pcx.json``: the peer's rows and the commands that wrote them (``commands``, or
    an older file's one ``command``), for the table to name; both empty when there is no file.

    Raises:
        ValueError: a file that is not that shape, in one line naming it.
    """
    if not path.is_file():
        return {"peer": {}, "peer_commands": []}
    try:
        data = json.loads(path.read_text())
        rows = data["variants"]
        ok = isinstance(rows, dict) and all(isinstance(v, dict) and isinstance(v.get("test_acc"), list)
                                            and all(isinstance(a, (int, float)) for a in v["test_acc"])
                                            for v in rows.values())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not the peer's results ({type(exc).__name__}: {exc}); rerun "
                         "benchmarks/peers/bench_pcx_conv.py or delete the file") from None
    if not ok:
        raise ValueError(f"{path}: 'variants' must map each variant to {{'test_acc': [numbers], ...}}; rerun "
                         "benchmarks/peers/bench_pcx_conv.py or delete the file")
    commands = data.get("commands", [data["command"]] if "command" in data else [])
    return {"peer": rows, "peer_commands": [c for c in commands if isinstance(c, str)]}


def format_peer(entry: dict | None) -> str:
    """A cell of the column "PCX, this budget": the peer's last-epoch test accuracy (mean ± std over its seeds), its
    PCX-protocol number and its epoch time, from the benchmark folder's ``pcx.json``."""
    if not entry or not entry.get("test_acc"):
        return "—"
    accs = np.array(entry["test_acc"], dtype=float)
    text = f"{_pct(float(accs.mean()))} ± {_pct(float(accs.std()))} ({len(accs)})"
    best = pcx_protocol(entry.get("best_test_acc") or [None])
    if best:
        text += f"; best-epoch {_pct(best['mean'])}"
    if entry.get("epoch_seconds"):
        text += f"; {float(statistics.median(entry['epoch_seconds'])):.3g} s/epoch"
    return text


def _short(value) -> str:
    """An option's value for the table: a long comma-separated list (a β schedule) as its first values and its length
    (``results.json`` keeps it whole)."""
    text = str(value)
    items = text.split(",")
    return text if len(text) <= 40 else f"{','.join(items[:3])},… ({len(items)} values)"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def format_results(protocol: Protocol, settings: Settings, results: dict) -> str:
    """The results as Markdown: the header (budget, data copy, command), the table, then the notes."""
    lines = header(protocol, settings, results["command"], results["data"])
    reused = [f for r in results["variants"] for f in r["finals"] if f.get("reused")]
    if reused:
        lines += [f"**Reused:** {len(reused)} final run(s) and their rows' search scores are those recorded in "
                  f"`{results['reused_from']}` (an earlier run of this benchmark: their folders are not in this one, "
                  "and their epoch times were measured there).", ""]
    if not results.get("complete", True):
        running = results.get("running")
        done = len(results["variants"]) - (running is not None)
        lines += [f"**Partial:** {done} of {len(protocol.variants)} variants so far"
                  + (f", and `{running}` with the seeds finished so far (its seed count says how many)" if running else "")
                  + "; rerun the command to continue.", ""]
    peer = results.get("peer") or {}
    lines += ["| variant | rule, options | chosen | search val acc % | test acc % (mean ± std, seeds) | "
              "PCX's protocol: best epoch, best K−2 of K | epoch time (median) | time / BP | PCX, this budget | "
              "published |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["variants"]:
        opts = r["rule"] + (" " + ", ".join(f"{k}={_short(v)}" for k, v in r["options"].items()) if r["options"] else "")
        ref = "—" if r["reference"] is None else f"{r['reference']['test_acc']:.2f}"
        if r["skipped"] and not r["finals"]:
            lines.append(f"| {_name_cell(r)} | {opts} | skipped | — | — | — | — | — | — | {ref} |")
            continue
        chosen = point_name(r["chosen"]) if r["search"] else f"{point_name(r['chosen'])} (not searched)"
        best = max((s["score"] for s in r["search"] if s["score"] is not None), default=None)
        acc = "all diverged" if r["test_acc_mean"] is None else (
            f"{_pct(r['test_acc_mean'])} ± {_pct(r['test_acc_std'])} ({r['n_seeds']}"
            + (f", {r['n_diverged']} diverged" if r["n_diverged"] else "") + ")")
        t = "—" if r["epoch_seconds"] is None else f"{r['epoch_seconds']:.3g} s"
        ratio = "—" if r["time_ratio"] is None else f"{r['time_ratio']:.2f}×"
        pcx = r.get("pcx_protocol")
        pcx = "—" if not pcx else f"{_pct(pcx['mean'])} ({pcx['kept']} of {pcx['of']})"
        lines.append(f"| {_name_cell(r)} | {opts} | {chosen} | {_pct(best)} | {acc} | {pcx} | {t} | {ratio} | "
                     f"{format_peer(peer.get(r['variant']))} | {ref} |")
    lines += ["", "Test accuracy: the last epoch of each final run; ± is numpy's standard deviation over the seeds "
              "(ddof = 0). PCX's protocol (how PCX reports, Pinchetti et al. 2024): each seed's best test accuracy over "
              "the epochs, the mean over the best K − 2 of K seeds (5 of 7 in PCX's tables; all for K ≤ 2): set it, not "
              "the last-epoch column, beside a published PCX number. PCX, this budget: PCX itself run on the same "
              "arrays, standardisation, augmentation, width, epochs and seeds (`benchmarks/peers/bench_pcx_conv.py`, "
              "its `pcx.json` in this folder): last-epoch mean ± std (seeds); best-epoch by PCX's protocol; its median "
              "epoch time. Epoch time: the median over every epoch of the final runs (with --compile, first epochs "
              f"include compiling); its ratio to `{protocol.baseline}`'s in this benchmark (runs resumed on another "
              "machine mix timings). Search scores per point: `results.json`; every run's metrics: its folder under "
              "`search/` or `final/`.", ""]
    if results.get("peer_commands"):
        lines += ["**PCX's column** (`pcx.json`) was made by " + "; ".join(f"`{c}`" for c in results["peer_commands"])
                  + ".", ""]
    skipped = [r for r in results["variants"] if r["skipped"]]
    if skipped:
        lines += ["Skipped:", ""] + [f"- {r['label']}: {r['skipped']}" for r in skipped] + [""]
    if results["reference_source"]:
        lines += [f"Published numbers: {results['reference_source']}. "
                  "They were measured at PCX's own settings and budget; compare at the full budget only.", ""]
    if results["notes"]:
        lines += [f"Notes: {results['notes']}", ""]
    return "\n".join(lines)


def _name_cell(row: dict) -> str:
    """A table row's first cell: the variant's label and its name (``--variants``, the plot's axis)."""
    return row["label"] if row["label"] == row["variant"] else f"{row['label']} (`{row['variant']}`)"


def _plot(results: dict, path: Path) -> None:
    """Test accuracy per variant with the seeds' std as error bars, PCX's numbers as markers."""
    from ..plots import plot_benchmark

    plot_benchmark(results, path)
