"""``inferlearn benchmark``: a tiny protocol on digits, end to end in seconds.

Oracles: the run folders' own metrics files, read here independently of the runner — the chosen point is the
argmax of their validation accuracies, mean ± std is numpy's over the final runs' last test accuracies, the time
ratio the ratio of medians of their epoch times; a rerun leaves every file of every run untouched; an interrupted
benchmark, rerun, gives the accuracies of an uninterrupted one.
"""
import contextlib
import io
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from inferlearn.benchmark import PROTOCOLS, Protocol, Settings, Variant, parse_budget
from inferlearn.benchmark.protocols import Budget, scaled_arch, scaled_epochs
from inferlearn.benchmark.runner import plan
from inferlearn.cli import main

TINY = {"name": "tiny", "summary": "a test protocol on digits", "data": "digits", "arch": "64-16-10", "val_size": 300,
        "train": {"epochs": 2, "batch_size": 50, "optimizer": "sgd", "limit_train": 300},
        "variants": [{"name": "bp", "rule": "backprop", "label": "BP", "search": {"lr": [0.01, 0.3]}},
                     {"name": "pc", "rule": "pc", "search": {"lr": [0.1], "rule.step_size": [0.05, 0.1]}},
                     {"name": "lpom-gelu", "rule": "lpom", "train": {"arch": "pcx-mlp:width=16,act=gelu"},
                      "search": {"lr": [0.05, 0.1]}}],
        "references": [{"variant": "bp", "test_acc": 97.5, "note": "a published number"}],
        "source": "a paper"}


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def _metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _files(root: Path) -> dict:
    """Every file of every run folder: (bytes, mtime)."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and p.parent.name.startswith("seed")}


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("protocol") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture(scope="module")
def bench(spec, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "out"
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(out), "--quiet")
    assert rc == 0, err
    assert "results.md" in stdout
    return out


def test_chosen_point_has_the_best_validation_accuracy(bench):
    results = json.loads((bench / "results.json").read_text())
    rows = {r["variant"]: r for r in results["variants"]}
    for name, grid in (("bp", [{"lr": 0.01}, {"lr": 0.3}]),
                       ("pc", [{"lr": 0.1, "rule.step_size": 0.05}, {"lr": 0.1, "rule.step_size": 0.1}])):
        folders = [bench / "search" / name / ",".join(f"{k}={v:g}" for k, v in p.items()) / "seed0" for p in grid]
        vals = [_metrics(f)[-1]["val_acc"] for f in folders]   # select = last epoch
        assert len(set(vals)) == 2   # the grid separates (otherwise the test could not fail)
        assert rows[name]["chosen"] == grid[int(np.argmax(vals))]
        # the final runs train at the chosen point, on the full training split (no validation split)
        cfg = json.loads((bench / "final" / name / "seed0" / "config.json").read_text())
        assert cfg["val_size"] == 0 and cfg["lr"] == grid[int(np.argmax(vals))]["lr"]
        if name == "pc":
            assert cfg["rule_options"]["step_size"] == grid[int(np.argmax(vals))]["rule.step_size"]
        search_cfg = json.loads((folders[0] / "config.json").read_text())
        assert search_cfg["val_size"] == 300 and "val_acc" in _metrics(folders[0])[0]


def test_mean_std_and_time_ratio_are_numpys_over_the_final_runs(bench):
    results = json.loads((bench / "results.json").read_text())
    rows = {r["variant"]: r for r in results["variants"]}
    medians = {}
    for name in ("bp", "pc"):
        finals = [_metrics(bench / "final" / name / f"seed{k}") for k in range(3)]
        accs = [m[-1]["test_acc"] for m in finals]
        assert len(finals[0]) == 2   # the protocol's epochs at the full budget
        assert rows[name]["test_acc_mean"] == pytest.approx(np.mean(accs), abs=1e-12)
        assert rows[name]["test_acc_std"] == pytest.approx(np.std(accs), abs=1e-12)
        assert rows[name]["n_seeds"] == 3
        medians[name] = statistics.median(r["epoch_seconds"] for m in finals for r in m)
    assert rows["pc"]["time_ratio"] == pytest.approx(medians["pc"] / medians["bp"])
    assert rows["bp"]["time_ratio"] == pytest.approx(1.0)
    seeds = {json.loads((bench / "final" / "bp" / f"seed{k}" / "config.json").read_text())["seed"] for k in range(3)}
    assert seeds == {0, 1, 2}


def test_results_say_budget_data_command_and_skips(bench, spec):
    md = (bench / "results.md").read_text()
    assert "full (the protocol's own width and epochs)" in md
    assert f"inferlearn benchmark {spec} --budget full --seeds 3" in md
    assert "`digits` from scikit-learn" in md
    assert "97.50" in md and "a paper" in md   # the published number, beside ours, with its source
    rows = {r["variant"]: r for r in json.loads((bench / "results.json").read_text())["variants"]}
    assert "box units" in rows["lpom-gelu"]["skipped"] and not (bench / "search" / "lpom-gelu").exists()
    assert "lpom" in md and "skipped" in md
    assert (bench / "results.png").stat().st_size > 1000


def test_rerun_skips_finished_runs_and_gives_the_same_table(bench, spec):
    before = _files(bench)
    table = json.loads((bench / "results.json").read_text())
    assert len(before) > 20
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(bench), "--quiet")
    assert rc == 0, err
    assert "(trained)" not in stdout and stdout.count("finished earlier, skipped") == 10
    assert _files(bench) == before   # nothing retrained or rewritten
    assert json.loads((bench / "results.json").read_text())["variants"] == table["variants"]


def test_interrupted_benchmark_resumes_to_the_same_accuracies(bench, spec, tmp_path, monkeypatch):
    import inferlearn.training.loop as loop

    out = tmp_path / "out"
    real, calls = loop.run_epoch, []

    def interrupt(s, config, epoch, *a, **k):   # Ctrl-C in the second epoch of the fourth run
        calls.append(epoch)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(s, config, epoch, *a, **k)

    monkeypatch.setattr(loop, "run_epoch", interrupt)
    rc, _, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(out), "--quiet")
    assert rc == 130 and "run the same command again" in err
    half = out / "final" / "bp" / "seed1"   # the fourth run: bp's search (2), then its finals
    assert len(_metrics(half)) == 1
    partial = json.loads((out / "results.json").read_text())   # bp's row with its one finished seed
    assert partial["running"] == "bp" and not partial["complete"] and partial["variants"][0]["n_seeds"] == 1
    assert "0 of 3 variants so far, and `bp` with the seeds finished so far" in (out / "results.md").read_text()
    first_epoch = (half / "metrics.jsonl").read_text()
    monkeypatch.setattr(loop, "run_epoch", real)
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(out), "--quiet")
    assert rc == 0, err
    assert (half / "metrics.jsonl").read_text().startswith(first_epoch)   # resumed, not restarted
    assert stdout.count("finished earlier, skipped") == 3
    ours = json.loads((out / "results.json").read_text())["variants"]
    ref = json.loads((bench / "results.json").read_text())["variants"]
    for a, b in zip(ours, ref):
        assert (a["chosen"], a.get("test_acc_mean"), a.get("test_acc_std")) == \
            (b["chosen"], b.get("test_acc_mean"), b.get("test_acc_std"))


def test_reuse_takes_recorded_runs_and_trains_only_the_rest(bench, spec, tmp_path):
    """A results.json whose run folders are gone: --reuse gives the same rows without training them, trains the
    seeds it lacks (a fourth seed here), and of a variant whose grid changed trains only the new points (and its
    finals only where the choice moved)."""
    changed = json.loads(spec.read_text())
    changed["variants"][1]["search"]["rule.step_size"] = [0.05, 0.07]   # pc's grid changed: 0.07 is new
    spec2 = tmp_path / "tiny.json"
    spec2.write_text(json.dumps(changed))
    saved = tmp_path / "saved.json"
    saved.write_text((bench / "results.json").read_text())
    out = tmp_path / "out"
    rc, stdout, err = _cli("benchmark", str(spec2), "--budget", "full", "--seeds", "4", "--out", str(out),
                           "--quiet", "--reuse", str(saved))
    assert rc == 0, err
    ref = {r["variant"]: r for r in json.loads(saved.read_text())["variants"]}
    rows = {r["variant"]: r for r in json.loads((out / "results.json").read_text())["variants"]}
    assert not (out / "search" / "bp").exists() and not (out / "final" / "bp" / "seed0").exists()
    assert sorted(p.name for p in (out / "final" / "bp").iterdir()) == ["seed3"]   # only the missing seed trained
    assert rows["bp"]["search"] == ref["bp"]["search"] and rows["bp"]["chosen"] == ref["bp"]["chosen"]
    accs = [f["test_acc"] for f in ref["bp"]["finals"]] + [_metrics(out / "final" / "bp" / "seed3")[-1]["test_acc"]]
    assert rows["bp"]["test_acc_mean"] == pytest.approx(np.mean(accs), abs=1e-12)
    assert [f.get("reused", False) for f in rows["bp"]["finals"]] == [True, True, True, False]
    assert (out / "search" / "pc" / "lr=0.1,rule.step_size=0.07").exists()   # pc's new point: searched, trained
    assert not (out / "search" / "pc" / "lr=0.1,rule.step_size=0.05").exists()   # its recorded point: taken
    assert rows["pc"]["search"][0] == ref["pc"]["search"][0]
    same = rows["pc"]["chosen"] == ref["pc"]["chosen"]   # pc's finals are taken only where its choice stayed
    assert [f.get("reused", False) for f in rows["pc"]["finals"]] == [same] * 3 + [False]
    md = (out / "results.md").read_text()
    assert f"**Reused:** {3 + 3 * same} final run(s)" in md and str(saved) in md
    # bp's two search points and three finals, pc's recorded point (and its finals where the choice stayed)
    assert stdout.count("recorded in --reuse, not trained") == 2 + 3 + 1 + 3 * same
    rc, stdout, _ = _cli("benchmark", str(spec2), "--budget", "full", "--seeds", "4", "--out", str(tmp_path / "o2"),
                         "--dry-run", "--reuse", str(saved))
    # a fresh folder: pc's new point is to run, so its finals wait for the search
    assert rc == 0 and stdout.count("[reused from --reuse]") == 2 + 3 + 1 and "[after the search]" in stdout


def test_reuse_takes_a_row_whose_search_went_past_its_grid(bench, spec, tmp_path):
    """A search that extended its grid past an edge records more points than the grid: its row is still taken."""
    saved = json.loads((bench / "results.json").read_text())
    bp = next(r for r in saved["variants"] if r["variant"] == "bp")
    bp["search"].append({"point": {"lr": 7.0}, "score": 0.0, "val_acc": [0.0]})   # an edge extension's point
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(tmp_path / "o"),
                           "--dry-run", "--reuse", str(path))
    assert rc == 0, err
    # bp's and pc's two search points and three finals each, none trained (bp's was refused before)
    assert stdout.count("[reused from --reuse]") == 2 * (2 + 3)


def test_reuse_reads_a_results_json_from_the_git_history(bench, spec, tmp_path, monkeypatch):
    """``--reuse REVISION:PATH`` takes the rows of a results.json that only the history holds (committed tables
    keep it there), as the file itself would; a revision git cannot show is one line naming it."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "results.json").write_text((bench / "results.json").read_text())
    git("add", "results.json")
    git("commit", "-qm", "table")
    git("rm", "-q", "results.json")
    git("commit", "-qm", "the table's json to the history")
    monkeypatch.chdir(tmp_path)
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(tmp_path / "o"),
                           "--dry-run", "--reuse", "HEAD~1:results.json")
    assert rc == 0, err
    assert stdout.count("[reused from --reuse]") == 2 * (2 + 3)
    rc, _, err = _cli("benchmark", str(spec), "--budget", "full", "--out", str(tmp_path / "o"), "--dry-run",
                      "--reuse", "HEAD:results.json")
    assert rc == 2 and "--reuse HEAD:results.json: no such file" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"), ("{not json", "not a benchmark's results.json"),
    ('{"variants": [], "protocol": "mlp-mnist", "budget_width": 1.0, "budget_epochs": 1.0}',
     "holds the benchmark mlp-mnist"),
])
def test_reuse_of_a_bad_file_is_one_line(spec, tmp_path, content, fragment):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    rc, _, err = _cli("benchmark", str(spec), "--budget", "full", "--out", str(tmp_path / "o"), "--reuse", str(path))
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_dry_run_prints_the_plan_and_trains_nothing(spec, tmp_path):
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "2", "--out", str(tmp_path / "o"),
                           "--dry-run")
    assert rc == 0, err
    runs = [line for line in stdout.splitlines() if line.startswith(("- search", "- final"))]
    assert len(runs) == 2 + 2 + 2 + 2 + 2 + 2   # bp: 2 points, pc: 2 points, lpom: 2 points; 2 seeds each
    assert "Budget:** full" in stdout and not (tmp_path / "o").exists()


def test_max_seeds_caps_a_rows_final_runs(tmp_path):
    """A row with ``max_seeds`` plans, trains and reports at most that many final runs, the others ``--seeds``."""
    capped = dict(TINY, variants=[TINY["variants"][0], {**TINY["variants"][1], "max_seeds": 1}])
    path = tmp_path / "capped.json"
    path.write_text(json.dumps(capped))
    out = tmp_path / "o"
    rc, _, err = _cli("benchmark", str(path), "--budget", "full", "--seeds", "2", "--out", str(out), "--quiet")
    assert rc == 0, err
    rows = {r["variant"]: r for r in json.loads((out / "results.json").read_text())["variants"]}
    assert [f["seed"] for f in rows["bp"]["finals"]] == [0, 1] and [f["seed"] for f in rows["pc"]["finals"]] == [0]
    assert sorted(p.name for p in (out / "final" / "pc").iterdir()) == ["seed0"]
    assert "(1) |" in (out / "results.md").read_text() and "(2) |" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="invalid max_seeds 0"):
        Variant("v", "backprop", max_seeds=0)


@pytest.mark.parametrize("args, fragment", [
    (["nope"], "Unknown protocol 'nope'"),
    (["mlp-mnist", "--budget", "2"], "Invalid --budget '2'"),
    (["mlp-mnist", "--budget", "cheap"], "Invalid --budget 'cheap'"),
    (["mlp-mnist", "--seeds", "0"], "Invalid --seeds 0"),
    (["missing.json"], "Protocol file missing.json does not exist"),
    ([], "Name a protocol"),
])
def test_bad_inputs_give_one_line(args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _cli("benchmark", *args, "--out", str(tmp_path / "o"))
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_full_budget_without_cuda_is_refused_in_one_line(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, _, err = _cli("benchmark", "vgg5-cifar10", "--budget", "full", "--out", str(tmp_path / "o"))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "needs a CUDA GPU" in err and "--budget cpu" in err and not (tmp_path / "o").exists()


def test_a_protocol_with_an_unknown_trainconfig_field_fails_loudly(tmp_path):
    bad = dict(TINY, train={**TINY["train"], "not_a_field": True})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    rc, _, err = _cli("benchmark", str(path), "--out", str(tmp_path / "o"))
    assert rc == 2 and "unknown TrainConfig field 'not_a_field'" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="unknown TrainConfig field 'not_a_field'"):
        Variant("v", "backprop", train={"not_a_field": 1})
    with pytest.raises(ValueError, match="set by the benchmark itself"):
        Protocol.from_dict(dict(TINY, train={"seed": 3}))


def test_another_budget_into_the_same_folder_is_refused(bench, spec):
    rc, _, err = _cli("benchmark", str(spec), "--budget", "0.5", "--out", str(bench), "--quiet")
    assert rc == 2 and "holds the benchmark tiny at budget full" in err


def test_budgets_scale_width_and_epochs():
    from inferlearn.models import build_model

    assert scaled_arch("pcx-mlp", 0.25) == "pcx-mlp:width=32"
    assert scaled_arch("vgg5:width=0.5,pool=avg", 0.5) == "vgg5:width=0.25,pool=avg"
    assert scaled_arch("784-64-32-10", 0.5) == "784-32-16-10"
    model = build_model(scaled_arch("pcx-mlp", 0.25), "relu", 784, 10, (1, 28, 28))
    assert [m.out_features for m in model if hasattr(m, "out_features")] == [32, 32, 32, 10]
    assert scaled_epochs(50, 0.1) == 5 and scaled_epochs(3, 0.1) == 1
    assert parse_budget("cpu", PROTOCOLS["vgg5-cifar10"]) == Budget("cpu", 0.125, 0.1)     # 1/8 width, 5 epochs
    assert parse_budget("smoke", PROTOCOLS["vgg5-cifar10"]) == Budget("smoke", 0.0625, 0.06)   # 1/16, 3 epochs
    assert parse_budget("smoke", PROTOCOLS["mlp-mnist"]) == Budget("smoke", 1.0, 1.0)
    for name in ("vgg5-cifar10", "vgg7-cifar10", "resnet18-cifar10"):
        cfg = plan(PROTOCOLS[name], Settings(out="x", budget=parse_budget("cpu", PROTOCOLS[name]), seeds=1))[0]["config"]
        assert cfg.epochs == 5 and "width=0.125" in cfg.arch and cfg.batch_size == 128
    assert parse_budget("1/4", PROTOCOLS["mlp-mnist"]) == Budget("1/4", 0.25, 0.25)
    with pytest.raises(ValueError, match="Cannot scale the width"):
        scaled_arch("conv:4-8", 0.5)


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_every_protocol_plans_valid_configs_at_every_budget(name, tmp_path):
    p = PROTOCOLS[name]
    for budget in ("full", "cpu", "smoke", "0.25"):
        runs = plan(p, Settings(out=str(tmp_path), budget=parse_budget(budget, p), seeds=2))
        assert {r["variant"] for r in runs} == {v.name for v in p.variants}
        assert all(r["config"].val_size == (p.val_size if r["kind"] == "search" else 0) for r in runs)
    assert p.variants[0].rule == "backprop" and p.variant(p.baseline).rule == "backprop"   # time ratios are to BP
    if name == "vgg5-cifar10":   # PCX's published numbers, beside the rows they belong to
        assert [(r.variant, r.test_acc) for r in p.references] == [("bp", 89.43), ("pc-centred", 89.47),
                                                                   ("ipc", 85.51)]
        assert "Pinchetti" in p.source and p.full_device == "cuda"


def test_a_diverged_run_scores_nothing_and_is_not_retrained(tmp_path):
    spec = {"name": "div", "summary": "a grid with a diverging point", "data": "digits", "arch": "64-16-10",
            "val_size": 300, "select": "best", "train": {"epochs": 2, "optimizer": "sgd", "limit_train": 200},
            "variants": [{"name": "bp", "rule": "backprop", "search": {"lr": [1e6, 0.3]}},
                         {"name": "bp-bad", "rule": "backprop", "search": {"lr": [1e6, 1e7]}}]}
    path, out = tmp_path / "div.json", tmp_path / "out"
    path.write_text(json.dumps(spec))
    args = ("benchmark", str(path), "--budget", "full", "--seeds", "1", "--out", str(out), "--quiet")
    rc, stdout, err = _cli(*args)
    assert rc == 0, err
    bad, good = out / "search" / "bp" / "lr=1e+06" / "seed0", out / "search" / "bp" / "lr=0.3" / "seed0"
    assert "diverged" in json.loads((bad / "diverged.json").read_text())["error"].lower()
    row, bad_row = json.loads((out / "results.json").read_text())["variants"]
    assert row["chosen"] == {"lr": 0.3} and row["search"][0]["score"] is None
    assert bad_row["skipped"] == "every search run diverged" and not (out / "final" / "bp-bad").exists()
    assert "every search run diverged" in (out / "results.md").read_text()
    assert row["search"][1]["score"] == max(r["val_acc"] for r in _metrics(good))   # select = best epoch
    before = _files(out)
    rc, stdout, err = _cli(*args)
    assert rc == 0 and "(trained)" not in stdout and "diverged (finished earlier, skipped)" in stdout
    assert _files(out) == before


def test_the_docs_protocol_example_is_a_valid_protocol(tmp_path):
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "benchmark.md").read_text()
    (block,) = re.findall(r"```json\n(.*?)```", text, re.S)
    p = Protocol.from_dict(json.loads(block))
    runs = plan(p, Settings(out=str(tmp_path), budget=parse_budget("full", p), seeds=2))
    assert len(runs) == 2 + 4 + 2 * 2   # bp: 2 points, pc: 2 × 2 points; 2 final seeds each


def test_dry_run_on_a_finished_benchmark_says_what_a_rerun_does(bench, spec, tmp_path):
    """On a finished benchmark every run — final runs at the point the search chose included — is "finished" (not a
    conflict), as the real rerun skips them all; the plan counts the runs and estimates the time of what is left from
    the folder's own epoch times."""
    args = ("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(bench), "--dry-run")
    rc, stdout, err = _cli(*args)
    assert rc == 0, err
    runs = [line for line in stdout.splitlines() if line.startswith(("- search", "- final", "- skip"))]
    states = [line.rsplit("[", 1)[1].rstrip("]") for line in runs]
    assert states and {s.split(":")[0] for s in states} == {"finished", "skipped"} and not any("conflict" in s for s in states)
    assert "- skip   lpom-gelu: lpom" in stdout   # the rule refuses the model: the table skipped it, so will a rerun
    finished, skipped = states.count("finished"), len(states) - states.count("finished")
    assert f"**{len(states)} runs:** {finished} finished, {skipped} skipped." in stdout and "Time left" not in stdout
    rc, stdout, _ = _cli(*args[:-2], str(tmp_path / "fresh"), "--dry-run")   # a fresh folder: the finals wait
    assert "[after the search]" in stdout and "[to run]" in stdout and "no estimate yet for bp" in stdout
    import shutil

    shutil.copytree(bench, tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy" / "final" / "bp" / "seed2")   # one final run lost: it alone trains again
    rc, stdout, _ = _cli(*args[:-2], str(tmp_path / "copy"), "--dry-run")
    assert f"finished, 1 skipped, 1 to run." in stdout and "for the 2 epochs of the variants with a finished run" in stdout


def test_a_rerun_cut_short_keeps_the_complete_table(bench, spec, tmp_path, monkeypatch):
    """A complete results table is only replaced by one holding as much: a rerun with more seeds interrupted after its
    first new run writes results.partial.md, and the complete results.md/json stay; the finished rerun replaces them."""
    import shutil

    import inferlearn.training.loop as loop

    out = tmp_path / "copy"
    shutil.copytree(bench, out)
    before = {name: (out / name).read_bytes() for name in ("results.md", "results.json")}
    real, calls = loop.run_epoch, []

    def interrupt(s, config, epoch, *a, **k):   # the first new seed of bp trains, the second is interrupted
        calls.append(epoch)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(s, config, epoch, *a, **k)

    monkeypatch.setattr(loop, "run_epoch", interrupt)
    rc, _, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "5", "--out", str(out), "--quiet")
    assert rc == 130, err
    assert {name: (out / name).read_bytes() for name in before} == before
    assert "Partial" in (out / "results.partial.md").read_text()
    monkeypatch.setattr(loop, "run_epoch", real)
    rc, stdout, err = _cli("benchmark", str(spec), "--budget", "full", "--seeds", "5", "--out", str(out), "--quiet")
    assert rc == 0, err
    table = json.loads((out / "results.json").read_text())
    assert table["complete"] and table["variants"][0]["n_seeds"] == 5 and not (out / "results.partial.md").exists()
