"""Run a benchmark protocol: a seeded search on a validation split, then final runs over K seeds.

For each variant of a :class:`~inferlearn.benchmark.protocols.Protocol`, in the protocol's order:

1. **Probe**: the rule runs one step on two training images of the model; a rule that refuses the model
   (the lifted energies on max pooling, …) is skipped, with its one-line reason in the table.
2. **Search**: every point of the variant's grid is trained with ``val_size`` held out (the *last* N training
   images, :func:`inferlearn.training.loop.split_train`) for ``search_seeds`` seeds; its score is the mean
   validation accuracy over the seeds, of the last epoch (``select="last"``) or of the best epoch
   (``select="best"``). The highest score wins (ties: the first point in grid order); a diverged run scores
   nothing. A grid of one point is not searched.
3. **Final runs**: the chosen point on the full training split (no validation split), seeds ``0 … K−1``;
   the table reports the last epoch's test accuracy, mean ± std over the seeds (numpy's, ``ddof=0``), the
   median epoch time over every epoch of those runs, and its ratio to the baseline's (back-propagation).

Every training run is an ordinary run folder of the one training loop (:func:`inferlearn.training.loop.train`)::

    OUT/benchmark.json                     the protocol, its budget and the command (a rerun must match)
    OUT/search/<variant>/<point>/seed<s>/  config.json, metrics.jsonl, checkpoint.pt, curves.png
    OUT/final/<variant>/seed<k>/
    OUT/results.md, results.json, results.png   (rewritten after each variant, marked partial until the last)

``--reuse RESULTS.json`` (:func:`load_reuse`) takes the search scores and final runs that an earlier ``results.json`` of
the same protocol and budget records, for the variants whose rule and options are unchanged, instead of training
them again (a grid that has grown trains only its new points): a committed table whose run folders are gone is
continued from it (``--reuse REVISION:PATH`` reads it from the git history, where the committed tables keep it). Each reused final run keeps its folder's
name and its epoch times (measured where it ran); the header counts the reused runs and names the file.

A rerun of the same command skips the runs whose folders hold them finished (without rewriting a file:
:func:`~inferlearn.training.loop.finished_history`), resumes an interrupted one from its last checkpoint, and
so produces the same table from the same metrics. A diverged run leaves ``diverged.json`` in its folder and is
not retrained. The benchmark sits above the training loop: it only builds :class:`TrainConfig` s and reads
run folders; the engine and the rules know nothing of it.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

from ..atomic import write_json
from ..errors import ConvergenceError, DivergenceError, RunFolderError, UnverifiedDataWarning
from ..training.config import TrainConfig
from ..training.loop import build, finished_history, train
from ..training.run_folder import RunFolder
from .protocols import Protocol, Variant, scaled_arch, scaled_epochs
from .report import header, summarise, write_results
from .settings import DIVERGED, PLAN, Settings, point_name


def run_config(protocol: Protocol, variant: Variant, point: dict, seed: int, search: bool,
               settings: Settings) -> TrainConfig:
    """The TrainConfig of one run: the protocol's settings, the variant's, the budget, the point and the seed;
    a search run holds out ``protocol.val_size`` images, a final run none.

    Raises:
        ValueError: the settings are invalid, naming the protocol and variant.
    """
    out = Path(settings.out) / ("search" if search else "final") / variant.name
    out = out / point_name(point) / f"seed{seed}" if search else out / f"seed{seed}"
    d = {"data": protocol.data, "arch": protocol.arch, **protocol.train, **variant.train}
    d["arch"] = scaled_arch(d["arch"], settings.budget.width)
    d["epochs"] = scaled_epochs(int(d.get("epochs", TrainConfig().epochs)), settings.budget.epochs)
    options = dict(variant.options)
    for key, value in point.items():
        if key.startswith("rule."):
            options[key[5:]] = value
        else:
            d[key] = value
    d.update(rule=variant.rule, rule_options=options, seed=seed, val_size=protocol.val_size if search else 0,
             out=str(out), device=settings.device, data_dir=settings.data_dir,
             allow_unverified=settings.allow_unverified, threads=settings.threads, compile=settings.compile)
    try:
        return TrainConfig.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"Protocol {protocol.name}, variant {variant.name}: {exc}") from None


def edge_extension(v: Variant, points: list[dict], scores: list, most: int) -> dict | None:
    """The next point to search when the best of ``points`` lies on the edge of a numeric grid axis: that axis one
    grid ratio further out (``3e-3`` chosen from ``(3e-4, 1e-3, 3e-3)``: ``9.5e-3``; the low end likewise), the other
    keys at the choice; at most ``most`` beyond each end (the protocol's ``extend``). ``None`` when the choice is inside the grid
    (or at an end already extended that far, or every point diverged)."""
    best = choose(points, scores)
    if best is None:
        return None
    chosen = points[best]
    for key, grid in v.search.items():
        values = sorted(grid) if all(isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0
                                     for g in grid) else []
        if len(values) < 2:
            continue
        line = sorted({p[key] for p in points if all(p[k] == chosen[k] for k in p if k != key)})
        for end, ratio, beyond in ((line[-1], values[-1] / values[-2], [x for x in line if x > values[-1]]),
                                   (line[0], values[0] / values[1], [x for x in line if x < values[0]])):
            if chosen[key] == end and len(beyond) < most and ratio != 1:
                candidate = {**chosen, key: float(f"{end * ratio:.6g}")}
                if candidate not in points:
                    return candidate
    return None


def _valid_extension(protocol: Protocol, v: Variant, points: list, scores: list, settings: Settings) -> dict | None:
    """:func:`edge_extension`, or ``None`` where the next point is not a valid setting (e.g. an inference step the
    rule refuses)."""
    extra = edge_extension(v, points, scores, protocol.extend)
    try:
        if extra is not None:
            run_config(protocol, v, extra, 0, True, settings)
    except ValueError:
        return None
    return extra


def selected(protocol: Protocol, settings: Settings) -> tuple:
    """The protocol's variants this invocation runs (``settings.variants``, in the protocol's order).

    Raises:
        ValueError: a name that is not one of the protocol's variants, in one line listing them.
    """
    if settings.variants is None:
        return tuple(protocol.variants)
    names = [v.name for v in protocol.variants]
    unknown = [n for n in settings.variants if n not in names]
    if unknown or not settings.variants:
        raise ValueError(f"Invalid --variants {','.join(settings.variants)}: {protocol.name} has no variant "
                         f"{', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(names)}")
    return tuple(v for v in protocol.variants if v.name in settings.variants)


def search_points(variant: Variant) -> list[dict]:
    """The points to search (none for a grid of one point: that point is the choice)."""
    grid = variant.grid()
    return grid if len(grid) > 1 else []


def plan(protocol: Protocol, settings: Settings) -> list[dict]:
    """Every run of the benchmark, without training: ``{"variant", "kind", "point", "seed", "config"}``; the final
    runs' point is ``None`` until the search has chosen it (their config is shown at the grid's first point).
    Builds every config, so an invalid protocol fails here, before anything trains."""
    runs = []
    for v in selected(protocol, settings):
        for point in search_points(v):
            for s in range(protocol.search_seeds):
                runs.append({"variant": v.name, "kind": "search", "point": point, "seed": s,
                             "config": run_config(protocol, v, point, s, True, settings)})
        fixed = v.grid()[0] if len(v.grid()) == 1 else None
        for k in range(v.final_seeds(settings.seeds)):
            runs.append({"variant": v.name, "kind": "final", "point": fixed, "seed": k,
                         "config": run_config(protocol, v, fixed or v.grid()[0], k, False, settings)})
    return runs


_REVISION_PATH = re.compile(r"(?P<rev>[^\s:/][^\s:]*):(?P<path>[^:]+)")


def reuse_text(path: str) -> str:
    """The text of ``--reuse``'s file: ``path`` itself, or, when no such file exists and it reads ``REVISION:PATH``
    (``3f66cc6:benchmarks/results/benchmark/mlp-mnist/results.json``), that file as the git history of the
    repository around the working directory holds it at that revision (``git show REVISION:PATH``) — the committed
    tables keep their ``results.json`` in the history only.

    Raises:
        FileNotFoundError: no such file, and not a revision and path that git can show.
    """
    file = Path(path)
    if file.exists() or not (m := _REVISION_PATH.fullmatch(path)):
        return file.read_text()
    try:
        shown = subprocess.run(["git", "show", f"{m['rev']}:{m['path']}"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        raise FileNotFoundError(path) from None
    if shown.returncode != 0:
        raise FileNotFoundError(path)
    return shown.stdout


def load_reuse(path: str | None, protocol: Protocol, settings: Settings) -> dict[str, dict]:
    """The rows of an earlier ``results.json`` that this benchmark can take instead of training them again.

    The file must be of the same protocol and budget; a variant is taken only when its rule and options equal the
    protocol's now (an unsearched variant takes only an unsearched row); otherwise it trains again. Within a taken
    row, each search point counts on its own when it records all ``search_seeds`` seeds — a grid that has grown
    since trains only its new points, and points a search added past a grid's edge are taken where the search
    reaches them again — and a final run counts when the row chose the point the search chooses now.

    Returns:
        ``{variant name: its row}`` (empty for ``path=None``).

    Raises:
        ValueError: the file is missing, not a benchmark's ``results.json``, or of another protocol or budget.
    """
    if path is None:
        return {}
    try:
        saved = json.loads(reuse_text(path))
        rows, name = saved["variants"], saved["protocol"]
        budget = (saved["budget_width"], saved["budget_epochs"])
    except FileNotFoundError:
        raise ValueError(f"--reuse {path}: no such file; give the results.json of an earlier run of this benchmark "
                         "(or REVISION:PATH, a results.json in this repository's git history)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--reuse {path}: not a benchmark's results.json ({type(exc).__name__}: {exc}); give the "
                         "results.json that `inferlearn benchmark` wrote") from None
    from .validate import check_reuse_rows

    check_reuse_rows(rows, path)   # malformed rows: one line naming the file and the key, not a TypeError
    if name != protocol.name or budget != (settings.budget.width, settings.budget.epochs):
        raise ValueError(f"--reuse {path} holds the benchmark {name} at budget {saved.get('budget')}, not "
                         f"{protocol.name} at {settings.budget.label}; give a results.json of this protocol and budget")
    taken = {}
    for row in rows:
        try:
            v = protocol.variant(row["variant"])
        except (KeyError, ValueError):
            continue
        searched_then, searched_now = bool(row.get("search")), bool(search_points(v))
        if (row.get("rule"), row.get("options")) == (v.rule, dict(v.options)) and (searched_now or not searched_then):
            taken[v.name] = row
    return taken


def reused_search(row: dict | None, point: dict, seeds: int) -> list | None:
    """The recorded per-seed validation scores of ``point`` in a reused row (``None``: not recorded, train it)."""
    for s in (row or {}).get("search", []):
        if s["point"] == point and len(s["val_acc"]) == seeds:
            return list(s["val_acc"])
    return None


def reused_final(row: dict | None, chosen: dict | None, seed: int) -> dict | None:
    """The recorded final run of ``seed`` in a reused row that chose ``chosen`` (``None``: train it)."""
    if row is None or row.get("chosen") != chosen:
        return None
    return next((dict(f) for f in row.get("finals", []) if f["seed"] == seed), None)


def run_state(config: TrainConfig) -> tuple[str, list[dict] | None]:
    """How a real run treats the folder of ``config``: ``("finished", history)``, ``("diverged", None)``,
    ``("resumes", None)`` (an interrupted run), ``("to run", None)``, or ``("conflict: …", None)`` (another run's
    settings: the real run refuses it)."""
    out = Path(config.out)
    try:
        history = finished_history(config)
    except RunFolderError as exc:
        return f"conflict: {exc}", None
    if history is not None:
        return "finished", history
    if (out / DIVERGED).exists() and (out / "config.json").exists():
        return "diverged", None
    return ("resumes", None) if (out / "config.json").exists() else ("to run", None)


def planned_choice(protocol: Protocol, v: Variant, settings: Settings,
                   row: dict | None) -> tuple[dict | None, bool, list[dict]]:
    """``(the point the search chooses, True, the points searched)`` when every search run of ``v`` is finished,
    diverged or recorded in ``--reuse`` (the choice the real run makes, with the points it adds beyond a grid's edge),
    else ``(None, False, the points so far)``; an unsearched variant's one point."""
    points = search_points(v)
    if not points:
        return v.grid()[0], True, []
    scores: list = []

    def recorded_score(point: dict):
        recorded = reused_search(row, point, protocol.search_seeds)
        if recorded is None:
            recorded = []
            for seed in range(protocol.search_seeds):
                state, history = run_state(run_config(protocol, v, point, seed, True, settings))
                if state not in ("finished", "diverged"):
                    return False
                recorded.append(None if history is None else score(history, protocol.select))
        scores.append(None if any(x is None for x in recorded) else statistics.fmean(recorded))
        return True

    for point in list(points):
        if not recorded_score(point):
            return None, False, points
    while (extra := _valid_extension(protocol, v, points, scores, settings)) is not None:   # as the real run
        points.append(extra)
        if not recorded_score(extra):
            return None, False, points
    best = choose(points, scores)
    return (None if best is None else points[best]), True, points


def refused_rows(out: Path) -> dict:
    """``{(variant, rule, options as JSON): reason}`` of the rows the folder's last table skipped because the rule
    refused the model (the probe of :func:`probe`)."""
    try:
        rows = json.loads((out / "results.json").read_text()).get("variants", [])
        return {(r["variant"], r["rule"], json.dumps(r.get("options", {}), sort_keys=True)): r["skipped"]
                for r in rows if r.get("skipped") and not r.get("finals") and not r.get("search")}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def format_plan(protocol: Protocol, settings: Settings, command: str) -> str:
    """The plan as text (``--dry-run``): the header every output carries, one line per run with its state — the
    state a real run would find: final runs at the point the finished search chose (or "after the search") — and
    the count of runs per state with an estimate of the time left."""
    lines = header(protocol, settings, command, data_line=f"`{protocol.data}` (read when the benchmark runs)")
    reuse = load_reuse(settings.reuse, protocol, settings)
    counts: dict[str, int] = {}
    todo: dict[str, int] = {}   # epochs left per variant
    measured: dict[str, list[float]] = {}
    refused = refused_rows(Path(settings.out))
    for v in selected(protocol, settings):
        row = reuse.get(v.name)
        reason = refused.get((v.name, v.rule, json.dumps(dict(v.options), sort_keys=True)))
        if reason is not None:   # the real run probes the rule again and skips it, training nothing
            counts["skipped"] = counts.get("skipped", 0) + 1
            lines.append(f"- skip   {v.name}: {v.rule} {dict(v.options) or ''} [skipped: {reason}]")
            continue
        chosen, decided, searched = planned_choice(protocol, v, settings, row)
        runs = [(p, s, True) for p in searched for s in range(protocol.search_seeds)]
        runs += [(chosen, k, False) for k in range(v.final_seeds(settings.seeds))]
        for point, seed, search in runs:
            kind = "search" if search else "final"
            cfg = run_config(protocol, v, point if point is not None else v.grid()[0], seed, search, settings)
            if search and reused_search(row, point, protocol.search_seeds) is not None or not search and decided and (
                    reused_final(row, chosen, seed) is not None):
                state, history = "reused from --reuse", None
            elif not search and not decided:
                state, history = "after the search", None
            elif not search and chosen is None:
                state, history = "skipped: every search run diverged", None
            else:
                state, history = run_state(cfg)
            if history:
                measured.setdefault(v.name, []).extend(h["epoch_seconds"] for h in history if "epoch_seconds" in h)
            if state in ("to run", "resumes", "after the search"):
                todo[v.name] = todo.get(v.name, 0) + cfg.epochs
            key = "conflict" if state.startswith("conflict") else state.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
            if point is None:   # the search chooses the point: show the variant's own settings
                grid = "; ".join(f"{k} in {list(vals)}" for k, vals in v.search.items())
                shown, options = f"the search's choice ({grid})", dict(v.options)
                lr = "searched" if "lr" in v.search else f"{cfg.resolved().lr:g}"
            else:
                shown, options, lr = point_name(point), cfg.rule_options, f"{cfg.resolved().lr:g}"
            lines.append(f"- {kind:6s} {v.name}: {shown}, seed {seed}: {cfg.rule} {options or ''} `{cfg.arch}` "
                         f"{cfg.epochs} epochs, {cfg.optimizer} lr {lr}, batch {cfg.batch_size} -> {cfg.out} [{state}]")
    total = sum(counts.values())
    lines += ["", f"**{total} runs:** " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + "."]
    known = {name: statistics.median(t) for name, t in measured.items() if t}
    left = sum(known[name] * e for name, e in todo.items() if name in known)
    unknown = sorted(name for name in todo if name not in known)
    parts = []
    if any(name in known for name in todo):
        parts.append(f"about {left / 3600:.1f} h for the {sum(e for n, e in todo.items() if n in known)} epochs of "
                     "the variants with a finished run here (at their median epoch time)")
    if unknown:
        parts.append(f"no estimate yet for {', '.join(unknown)} ({sum(todo[n] for n in unknown)} epochs: none of their "
                     "runs has finished in this folder)")
    if parts:
        lines.append("**Time left:** " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def probe(config: TrainConfig) -> str | None:
    """``None`` when the rule runs one step on the model (two training images, on the CPU), else the rule's
    one-line reason for refusing it."""
    with warnings.catch_warnings():   # the runs themselves say that the copy is unverified
        warnings.simplefilter("ignore", UnverifiedDataWarning)
        setup = build(config.replace(device="cpu", compile="off", limit_train=2, val_size=0))   # not 50,000 images
    try:
        setup.rule.backward(setup.model, setup.train_x[:2], setup.train_y[:2])
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None


def run_one(config: TrainConfig, progress: bool, log: Callable[[str], None] | None) -> dict:
    """Train one run unless its folder holds it finished (or diverged): ``{"history", "trained"}`` or
    ``{"diverged", "trained"}``. Resumes an interrupted run from its last checkpoint."""
    out = Path(config.out)
    history = finished_history(config)
    if history is not None:
        return {"history": history, "trained": False}
    if (out / DIVERGED).exists() and (out / "config.json").exists():
        return {"diverged": json.loads((out / DIVERGED).read_text())["error"], "trained": False}
    try:
        history = train(config, progress=progress, resume=(out / "config.json").exists(), log=None)
    except (DivergenceError, ConvergenceError) as exc:   # the loss, the weights or PC's value nodes blew up
        message = str(exc).split("; last good checkpoint")[0]
        write_json({"error": message}, out / DIVERGED)
        if log:
            log(f"  diverged: {message}")
        return {"diverged": message, "trained": True}
    return {"history": history, "trained": True}


def score(history: list[dict], select: str) -> float:
    """The search score of one run: the validation accuracy of its last epoch, or the best one."""
    values = [r["val_acc"] for r in history]
    return values[-1] if select == "last" else max(values)


def choose(points: list[dict], scores: list[float | None]) -> int | None:
    """The index of the highest score (the first on ties); ``None`` when every point diverged."""
    best = None
    for i, s in enumerate(scores):
        if s is not None and (best is None or s > scores[best]):
            best = i
    return best


def run_benchmark(protocol: Protocol, settings: Settings, command: str, progress: bool = True,
                  log: Callable[[str], None] | None = print) -> dict:
    """Run (or continue) the whole benchmark and write ``results.md``, ``results.json`` and ``results.png``.

    Returns:
        the results (what ``results.json`` holds).

    Raises:
        ValueError: an invalid protocol or settings (before anything trains).
        RunFolderError: ``settings.out`` holds another benchmark, another run, or a run with other settings.
    """
    runs = plan(protocol, settings)   # every config is valid before the first run trains
    load_reuse(settings.reuse, protocol, settings)   # and so is --reuse's file
    out = Path(settings.out)
    with RunFolder(out) as top:   # locked while the benchmark runs
        if top.holds_run():
            raise RunFolderError(f"{out} holds a training run, not a benchmark; choose another --out")
        _check_plan(out, protocol, settings)
        write_json({"protocol": protocol.name, "budget": settings.budget.label, "width": settings.budget.width,
                    "epochs": settings.budget.epochs, "command": command, "spec": protocol.to_dict()}, out / PLAN)
        return _run(protocol, settings, command, runs, progress, log)


def _check_plan(out: Path, protocol: Protocol, settings: Settings) -> None:
    if not (out / PLAN).exists():
        return
    saved = json.loads((out / PLAN).read_text())
    budget = settings.budget
    if (saved.get("protocol"), saved.get("width"), saved.get("epochs")) != (protocol.name, budget.width, budget.epochs):
        raise RunFolderError(f"{out} holds the benchmark {saved.get('protocol')} at budget {saved.get('budget')}; "
                             f"rerun that command to continue it, or choose another --out for {protocol.name} at "
                             f"{settings.budget.label}")


def _run(protocol: Protocol, settings: Settings, command: str, runs: list[dict], progress: bool, log) -> dict:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(runs), desc=f"benchmark {protocol.name}", unit="run", disable=not progress)
    say = (lambda m: tqdm.write(m)) if (log and progress) else log
    rows, reuse = [], load_reuse(settings.reuse, protocol, settings)
    for v in selected(protocol, settings):
        mine = [r for r in runs if r["variant"] == v.name]
        old = reuse.get(v.name)
        first = mine[0]["config"]
        reason = probe(first)
        row = {"variant": v.name, "label": v.label or v.name, "rule": v.rule, "options": dict(v.options),
               "skipped": reason, "search": [], "chosen": None, "finals": []}
        rows.append(row)
        if reason is not None:
            if say:
                say(f"{v.name}: skipped ({reason})")
            bar.update(len(mine))
            continue
        points = search_points(v)
        scores = []

        def evaluate(point: dict) -> None:
            per_seed = []
            recorded = reused_search(old, point, protocol.search_seeds)
            if recorded is not None:
                per_seed = recorded
                _note(say, {"kind": "search", "variant": v.name, "point": point, "seed": "all"}, {"reused": True},
                      "val " + ", ".join("diverged" if x is None else f"{x:.4f}" for x in recorded))
                bar.update(protocol.search_seeds)
            for seed in range(protocol.search_seeds if recorded is None else 0):
                r = {"kind": "search", "variant": v.name, "point": point, "seed": seed,
                     "config": run_config(protocol, v, point, seed, True, settings)}
                res = run_one(r["config"], progress, say)
                per_seed.append(None if "diverged" in res else score(res["history"], protocol.select))
                _note(say, r, res, f"val {per_seed[-1]:.4f}" if per_seed[-1] is not None else "diverged")
                bar.update(1)
            scores.append(None if any(s is None for s in per_seed) else statistics.fmean(per_seed))
            row["search"].append({"point": point, "val_acc": per_seed, "score": scores[-1]})

        for point in list(points):
            evaluate(point)
        while points and (extra := _valid_extension(protocol, v, points, scores, settings)) is not None:
            if say:
                say(f"search {v.name}: the choice lies on the grid's edge; extending it to {point_name(extra)}")
            bar.total += protocol.search_seeds
            points.append(extra)
            evaluate(extra)
        best = choose(points, scores) if points else None
        row["chosen"] = points[best] if best is not None else None if points else v.grid()[0]
        if row["chosen"] is None:
            row["skipped"] = "every search run diverged"
            bar.update(v.final_seeds(settings.seeds))
        for k in range(v.final_seeds(settings.seeds) if row["chosen"] is not None else 0):
            cfg = run_config(protocol, v, row["chosen"], k, False, settings)
            final, res = reused_final(old, row["chosen"], k), {"reused": True}
            if final is not None:
                final["reused"] = True
            else:
                res = run_one(cfg, progress, say)
                final = {"seed": k, "folder": cfg.out}
            if "diverged" in res:
                final["diverged"] = res["diverged"]
            elif "history" in res:
                final.update(test_acc=res["history"][-1]["test_acc"],
                             best_test_acc=max(h["test_acc"] for h in res["history"]),
                             epoch_seconds=[h["epoch_seconds"] for h in res["history"]],
                             data_verified=all(h.get("data_verified", True) for h in res["history"]))
            row["finals"].append(final)
            _note(say, {"kind": "final", "variant": v.name, "point": row["chosen"], "seed": k}, res,
                  f"test {final['test_acc']:.4f}" if "test_acc" in final else "diverged")
            bar.update(1)
            if k + 1 < v.final_seeds(settings.seeds) and not res.get("reused"):   # the seeds so far, in case the
                summarise(row)                                                   # benchmark stops before the last
                write_results(protocol, settings, command, rows, running=v.name)
        if row["chosen"] is not None:
            summarise(row)
        if len(rows) < len(selected(protocol, settings)):   # the variants so far, in case the benchmark stops here
            write_results(protocol, settings, command, rows)
    bar.close()
    return write_results(protocol, settings, command, rows)


def _note(say, run: dict, res: dict, what: str) -> None:
    if say:
        done = ("recorded in --reuse, not trained" if res.get("reused") else
                "trained" if res["trained"] else "finished earlier, skipped")
        say(f"{run['kind']} {run['variant']} {point_name(run['point'])} seed {run['seed']}: {what} ({done})")
