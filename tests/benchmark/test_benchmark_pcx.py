"""The benchmark's PCX side: ``--variants``, PCX's reporting protocol, the peer's column, and PCX's recipes as rows.

Oracles: PCX's own loop for β per epoch (``PC.py`` at commit c722834, transcribed here), the recipe files' numbers
as the rows' configs, numpy over the run folders' metrics for the best-epoch statistics, and a real run of a subset
then of every variant (the finished runs of the first are not trained again).
"""
import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from inferlearn.benchmark import PROTOCOLS, Settings, parse_budget
from inferlearn.benchmark.pcx_recipes import PCX_VGG5, PCX_VGG7, pcx_betas
from inferlearn.benchmark.report import pcx_protocol
from inferlearn.benchmark.runner import plan
from inferlearn.cli import main

TINY = {"name": "tiny2", "summary": "a test protocol on digits", "data": "digits", "arch": "64-16-10", "val_size": 300,
        "train": {"epochs": 3, "batch_size": 50, "optimizer": "sgd", "limit_train": 300},
        "variants": [{"name": "bp", "rule": "backprop", "train": {"lr": 0.3}},
                     {"name": "pc", "rule": "pc", "train": {"lr": 0.1}}]}


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def _pcx_loop_betas(beta, factor, ir, epochs=50):
    """PCX's PC.py, line for line: β of epoch e and its clipping."""
    out = []
    for e in range(epochs):
        b = factor * (beta + ir * e)
        if b >= 1.0:
            b = 1.0
        elif b <= -1.0 and factor == 0:
            b = -1.0
        elif b <= -1.0 and factor != 0:
            b = 1.0
        out.append(b)
    return out


@pytest.mark.parametrize("beta,factor,ir", [(0.32297201469734277, 1.0, 0.02), (0.17877062530418192, -1.0, 0.02),
                                           (0.1, 1.0, 0.0), (0.1, -1.0, 0.02)])
def test_pcx_betas_follow_pcx_loop(beta, factor, ir):
    np.testing.assert_allclose(pcx_betas(beta, factor, ir), _pcx_loop_betas(beta, factor, ir), atol=1e-10)


def test_pcx_rows_carry_the_recipe_files_numbers():
    """The rows' configs hold PCX's VGG-5 CIFAR-10 PC-CE file (T 8, x lr 0.0147 momentum 0.05, w lr 2.64e-4, wd 1.21e-5,
    GELU), its schedule, and the per-sample and 1/B readings of the value-node rate."""
    p = PROTOCOLS["vgg5-cifar10"]
    runs = {r["variant"]: r["config"] for r in plan(p, Settings(out="x", budget=parse_budget("cpu", p), seeds=1))}
    per_sample, code = runs["pcx-pc-ce"], runs["pcx-pc-ce-b"]
    assert per_sample.rule_options["step_size"] == pytest.approx(0.014708110891388754)
    assert code.rule_options["step_size"] == pytest.approx(0.014708110891388754 / 128)
    for cfg in (per_sample, code):
        assert (cfg.rule, cfg.optimizer, cfg.lr_schedule, cfg.batch_size) == ("pc", "adamw", "warmup-cosine", 128)
        assert cfg.lr == pytest.approx(2.641020393177285e-4) and cfg.weight_decay == pytest.approx(1.2107509557065504e-5)
        assert cfg.rule_options | {"step_size": 0} == {"steps": 8, "inference_optimizer": "momentum",
                                                        "inference_momentum": 0.05, "output": "ce", "step_size": 0}
        assert cfg.arch == "vgg5:width=0.125,act=gelu" and cfg.epochs == 5
    nn = runs["pcx-pc-nn-b"].rule_options
    assert nn["nudging"] == "target"   # the file's β, −(0.17877062530418192 + 0.02 e), to pcx_betas' 10 digits
    assert [float(v) for v in nn["beta_schedule"].split(",")[:2]] == pytest.approx([-0.17877062530418192,
                                                                                  -0.19877062530418192], abs=1e-10)
    assert runs["pcx-bp-ce"].rule_options == {"loss": "cross-entropy"}
    assert runs["pcx-epc-ce"].rule_options == {"output": "ce"} and runs["pcx-epc-ce"].lr == runs["pcx-bp-ce"].lr
    assert {r.name for r in PCX_VGG5} == {r.name for r in PCX_VGG7} == {"bp-se", "bp-ce", "pc-se", "pc-ce", "pc-pn",
                                                                         "pc-nn", "pc-cn"}
    assert len(PCX_VGG5[-1].betas) == 48 and set(PCX_VGG5[-1].betas) == {0.9, -0.9}


def _peer_driver():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "bench_pcx_conv", Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "bench_pcx_conv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)   # inferlearn and numpy only: the JAX worker is not imported
    return module


@pytest.mark.parametrize("recipes, name", [(PCX_VGG5, "pc-pn"), (PCX_VGG5, "pc-nn"), (PCX_VGG5, "pc-cn"),
                                           (PCX_VGG7, "pc-cn"), (PCX_VGG5, "pc-ce"), (PCX_VGG5, "bp-ce")])
def test_the_pcx_worker_gets_the_beta_our_rule_uses_each_epoch(recipes, name):
    """The peer driver passes PCX's worker, per epoch, the β that inferlearn's row of the same recipe uses at that
    epoch (the rule's begin_epoch); β = 1 recipes pass none (the worker's default, the label)."""
    from inferlearn.rules import make_rule

    recipe = next(r for r in recipes if r.name == name)
    args = _peer_driver().worker_args(recipe, "vgg5", 0.125, 5, 0)
    if not recipe.betas:
        assert "--betas" not in args
        return
    worker = [float(b) for b in args[args.index("--betas") + 1].split(",")]
    row = next(v for v in PROTOCOLS["vgg5-cifar10" if recipes is PCX_VGG5 else "vgg7-cifar10"].variants
               if v.name == f"pcx-{name}-b")
    rule = make_rule("pc", row.options)
    ours = []
    for epoch in range(1, 6):
        rule.begin_epoch(epoch, 50000)
        ours.append(rule._epoch_beta)
    assert worker == ours == list(recipe.betas[:5])


def test_pcx_protocol_is_the_mean_of_the_best_k_minus_2():
    assert pcx_protocol([0.5, 0.7, 0.6, 0.9, 0.8])["mean"] == pytest.approx(0.8)     # the best 3 of 5
    assert pcx_protocol([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]) | {"mean": 0} == {"mean": 0, "std": pytest.approx(
        np.std([0.3, 0.4, 0.5, 0.6, 0.7])), "kept": 5, "of": 7}                         # PCX's 5 of 7
    assert pcx_protocol([0.4, 0.6]) == {"mean": pytest.approx(0.5), "std": pytest.approx(0.1), "kept": 2, "of": 2}
    assert pcx_protocol([0.4, None]) is None


def test_a_subset_of_variants_then_all_of_them(tmp_path):
    """``--variants pc`` runs and tables only pc; the run of every variant then trains bp and skips pc's finished runs.
    The table's best-epoch column is numpy's over the run folders' metrics; the peer's column reads pcx.json."""
    spec, out = tmp_path / "tiny2.json", tmp_path / "out"
    spec.write_text(json.dumps(TINY))
    args = ("benchmark", str(spec), "--budget", "full", "--seeds", "3", "--out", str(out), "--quiet")
    rc, stdout, err = _cli(*args, "--variants", "pc")
    assert rc == 0, err
    res = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in res["variants"]] == ["pc"] and not res["complete"]
    assert not (out / "final" / "bp").exists() and "Partial:** 1 of 2" in (out / "results.md").read_text()
    best = [max(json.loads(line)["test_acc"] for line in (out / "final" / "pc" / f"seed{k}" / "metrics.jsonl")
                .read_text().splitlines()) for k in range(3)]
    row = res["variants"][0]
    assert [f["best_test_acc"] for f in row["finals"]] == best
    assert row["pcx_protocol"]["mean"] == pytest.approx(max(best)) and row["pcx_protocol"]["kept"] == 1
    (out / "pcx.json").write_text(json.dumps({"variants": {"pc": {"test_acc": [0.25, 0.35], "best_test_acc": [0.3, 0.4],
                                                                  "epoch_seconds": [2.0, 4.0, 3.0]}},
                                           "commands": ["python bench_pcx_conv.py --seeds 2"]}))
    rc, stdout, err = _cli(*args)
    assert rc == 0, err
    assert "final pc default seed 0: test" in stdout and "(finished earlier, skipped)" in stdout
    assert "final bp default seed 0: test" in stdout and "(trained)" in stdout
    res = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in res["variants"]] == ["bp", "pc"] and res["complete"]
    md = (out / "results.md").read_text()
    assert "30.00 ± 5.00 (2); best-epoch 35.00; 3 s/epoch" in md and "PCX, this budget" in md
    assert "**PCX's column** (`pcx.json`) was made by `python bench_pcx_conv.py --seeds 2`." in md   # its command
    (out / "pcx.json").write_text(json.dumps({"variants": ["pc"]}))
    rc, _, err = _cli(*args)
    assert rc == 2 and "pcx.json" in err and len(err.strip().splitlines()) == 1


def test_unknown_variants_and_smoke_budget(tmp_path):
    rc, _, err = _cli("benchmark", "vgg5-cifar10", "--variants", "bp,nosuch", "--dry-run", "--out", str(tmp_path / "o"))
    assert rc == 2 and "has no variant 'nosuch'" in err and "pcx-pc-ce-b" in err
    rc, stdout, _ = _cli("benchmark", "vgg5-cifar10", "--budget", "smoke", "--variants", "bp", "--dry-run", "--seeds",
                         "1", "--out", str(tmp_path / "o"))
    assert rc == 0 and "vgg5:width=0.0625`, 3 epochs" in stdout


def test_edge_extension_goes_one_grid_ratio_out_and_stops():
    from inferlearn.benchmark import Variant
    from inferlearn.benchmark.runner import edge_extension

    v = Variant("bp", "backprop", search={"lr": (3e-4, 1e-3, 3e-3), "momentum": (0.0, 0.5)})
    pts = v.grid()
    top = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]        # lr 3e-3, momentum 0.5 best: both axes on their top ends
    assert edge_extension(v, pts, top, 2) == {"lr": 9e-3, "momentum": 0.5}
    assert edge_extension(v, pts + [{"lr": 9e-3, "momentum": 0.5}], top + [0.7], 2) == {"lr": 2.7e-2, "momentum": 0.5}
    assert edge_extension(v, pts + [{"lr": 9e-3, "momentum": 0.5}], top + [0.7], 1) is None   # one beyond the end
    low = [0.9, 0.1, 0.2, 0.3, 0.4, 0.5]         # lr 3e-4 best (momentum's grid holds 0: no geometric axis)
    assert edge_extension(v, pts, low, 2) == {"lr": 9e-5, "momentum": 0.0}
    inner = [0.1, 0.2, 0.9, 0.3, 0.4, 0.5]       # lr 1e-3 best: inside
    assert edge_extension(v, pts, inner, 2) is None
    assert edge_extension(v, pts, [None] * 6, 2) is None


def test_a_search_on_the_edge_extends_the_grid_before_the_final_runs(tmp_path):
    """extend=1: bp's choice at the grid's top (lr 0.03 of [0.01, 0.03]) adds lr 0.09; the final runs use the best of
    the three by the run folders' validation accuracies, and the dry run afterwards finds every run finished."""
    spec = dict(TINY, name="edge", extend=1, variants=[{"name": "bp", "rule": "backprop", "search": {"lr": [0.01, 0.03]}}])
    path, out = tmp_path / "edge.json", tmp_path / "out"
    path.write_text(json.dumps(spec))
    args = ("benchmark", str(path), "--budget", "full", "--seeds", "1", "--out", str(out), "--quiet")
    rc, stdout, err = _cli(*args)
    assert rc == 0, err
    assert "extending it to lr=0.09" in stdout
    row = json.loads((out / "results.json").read_text())["variants"][0]
    val = {lr: json.loads((out / "search" / "bp" / f"lr={lr:g}" / "seed0" / "metrics.jsonl").read_text()
                          .splitlines()[-1])["val_acc"] for lr in (0.01, 0.03, 0.09)}
    assert [s["point"]["lr"] for s in row["search"]] == [0.01, 0.03, 0.09]
    assert row["chosen"]["lr"] == max(val, key=val.get)
    rc, stdout, _ = _cli(*args[:-1], "--dry-run")
    assert rc == 0 and "**4 runs:** 4 finished." in stdout


def test_the_peer_row_keeps_the_seeds_only_the_earlier_pcx_json_records():
    """A seed whose result file is gone but which the committed pcx.json records stays in the row, in seed order,
    with its own epochs' times; a seed with a file is taken from the file (here: seeds 1 and 2 new, 0 recorded)."""
    earlier = {"test_acc": [0.43], "best_test_acc": [0.44], "epoch_seconds": [5.0, 6.0], "compile_s": [1.5], "seeds": [0]}
    runs = [{"args": {"seed": s}, "test_acc": [0.3, acc], "epoch_seconds": [s, s + 0.5], "compile_s": 2.0}
            for s, acc in ((2, 0.42), (1, 0.41))]
    row = _peer_driver().merged_row(runs, earlier, epochs=2)
    assert row == {"test_acc": [0.43, 0.41, 0.42], "best_test_acc": [0.44, 0.41, 0.42],
                   "epoch_seconds": [5.0, 6.0, 1, 1.5, 2, 2.5], "compile_s": [1.5, 2.0, 2.0], "seeds": [0, 1, 2]}
    assert _peer_driver().merged_row(runs[:1], None, epochs=2)["seeds"] == [2]
