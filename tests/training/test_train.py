"""The training loop: determinism, exact resume (also after kill -9), divergence, outputs."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from inferlearn.atomic import read_jsonl
from inferlearn.training.config import TrainConfig
from inferlearn.errors import DivergenceError, RunFolderError
from inferlearn.training.loop import train

DROP = ("epoch_seconds",)


def _strip(history):
    return [{k: v for k, v in r.items() if k not in DROP} for r in history]


def _cfg(tmp_path, name, **kw):
    base = dict(data="digits", arch="64-16-10", epochs=4, batch_size=64, lr=0.1, seed=3, out=str(tmp_path / name))
    return TrainConfig(**(base | kw))


def test_outputs_and_determinism(tmp_path):
    """Same seed and config give identical metrics; every promised file is written."""
    h1 = train(_cfg(tmp_path, "a"), progress=False, log=None)
    h2 = train(_cfg(tmp_path, "b"), progress=False, log=None)
    assert _strip(h1) == _strip(h2)
    out = tmp_path / "a"
    for f in ("config.json", "metrics.jsonl", "checkpoint.pt", "curves.png"):
        assert (out / f).exists(), f
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert {"epoch", "train_loss", "train_acc", "test_acc", "active_fraction", "epoch_seconds"} <= set(rows[0])
    assert json.loads((out / "config.json").read_text())["seed"] == 3
    assert h1[-1]["test_acc"] > 0.5, "training on digits should learn something in 4 epochs"


def test_resume_gives_same_final_metrics(tmp_path):
    """An interrupted run (2 of 4 epochs) resumed to the end equals an uninterrupted one."""
    full = train(_cfg(tmp_path, "full", optimizer="adam", lr=0.01), progress=False, log=None)
    train(_cfg(tmp_path, "part", optimizer="adam", lr=0.01, epochs=2), progress=False, log=None)
    resumed = train(_cfg(tmp_path, "part", optimizer="adam", lr=0.01), progress=False, resume=True, log=None)
    assert _strip(resumed) == _strip(full)
    assert [r["epoch"] for r in read_jsonl(tmp_path / "part" / "metrics.jsonl")] == [1, 2, 3, 4]


def test_resume_refuses_a_different_run(tmp_path):
    train(_cfg(tmp_path, "x", epochs=1), progress=False, log=None)
    with pytest.raises(RunFolderError, match="different settings"):
        train(_cfg(tmp_path, "x", epochs=2, lr=0.5), progress=False, resume=True, log=None)


@pytest.mark.parametrize("recipe", [[], ["--standardize", "on", "--augment", "crop-flip:force"]], ids=["plain", "crop-flip"])
def test_kill_9_then_resume(tmp_path, recipe):
    """kill -9 at an arbitrary moment (possibly mid-checkpoint) loses at most the current epoch and
    never corrupts a file: the resumed run ends with the same metrics as an uninterrupted one (with
    augmentation too: its generator state is in the checkpoint)."""
    args = ["--data", "digits", "--arch", "64-32-10", "--epochs", "40", "--batch-size", "16", "--lr", "0.05",
            "--seed", "1", "--quiet", *recipe]
    cmd = [sys.executable, "-m", "inferlearn", "train", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ref = subprocess.run(cmd + ["--out", str(tmp_path / "ref")], env=env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen(cmd + ["--out", str(tmp_path / "run")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) < 5:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    assert 5 <= done < 40, "the run was not interrupted mid-way"
    res = subprocess.run([sys.executable, "-m", "inferlearn", "train", "--resume", str(tmp_path / "run"), "--quiet"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    a, b = read_jsonl(tmp_path / "ref" / "metrics.jsonl"), read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert _strip(a) == _strip(b)
    assert not list((tmp_path / "run").glob(".*.tmp")), "a temporary file was left behind"


def test_divergence_stops_with_epoch_and_step(tmp_path):
    with pytest.raises(DivergenceError, match=r"epoch 1, step \d+"):
        train(_cfg(tmp_path, "div", lr=1e6), progress=False, log=None)


@pytest.mark.parametrize("rule", ["contrastive", "pc"])
def test_divergence_of_an_iterative_rule_is_divergence(tmp_path, rule):
    """The loop checks the weights once an epoch and the loss every step: a rule whose solver refuses the
    previous step's non-finite weights must still end in DivergenceError naming the epoch and step."""
    with pytest.raises(DivergenceError, match=r"epoch 1, step \d+"):
        train(_cfg(tmp_path, rule, rule=rule, lr=1e38, optimizer="sgd"), progress=False, log=None)


def test_training_data_checked_once():
    """The per-batch checks are skipped in the loop because the split is checked once, here."""
    import torch
    from inferlearn.training.loop import check_training_data

    x, y = torch.rand(20, 4), torch.arange(20) % 3
    check_training_data(x, y, 3, "toy")
    x[5, 1] = float("inf")
    with pytest.raises(ValueError, match=r"toy: the training inputs hold NaN or inf"):
        check_training_data(x, y, 3, "toy")
    with pytest.raises(ValueError, match=r"toy: Labels out of range: found values in \[0, 2\], the network has 2 outputs"):
        check_training_data(torch.rand(20, 4), y, 2, "toy")


def test_finite_explosion_is_divergence(tmp_path):
    """Bounded units let output weights explode to ~1e16 without a NaN: the loss-ratio test catches it."""
    with pytest.raises(DivergenceError, match=r"loss \d[\d.e+]* at epoch 1, step \d+ \(first loss"):
        train(_cfg(tmp_path, "boom", act="hard-tanh", lr=3.0, divergence_factor=100.0), progress=False, log=None)


@pytest.mark.parametrize("bad, msg", [
    (dict(lr=-0.1), "Invalid learning rate: -0.1"),
    (dict(rule="nope"), "Unknown rule 'nope'"),
    (dict(act="swish"), "Unknown unit type 'swish'"),
    (dict(data="imagenet"), "Unknown dataset 'imagenet'"),
    (dict(optimizer="lbfgs"), "Unknown optimizer"),
    (dict(epochs=0), "Invalid epochs"),
    (dict(arch="64-x-10"), "Invalid architecture"),
    (dict(dtype="float16"), "Unknown dtype 'float16'"),
])
def test_bad_config(tmp_path, bad, msg):
    with pytest.raises(Exception, match=msg):
        _cfg(tmp_path, "bad", **bad)


def test_architecture_must_fit_data(tmp_path):
    with pytest.raises(ValueError, match="does not fit digits"):
        train(_cfg(tmp_path, "fit", arch="784-10"), progress=False, log=None)


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="Unknown config keys"):
        TrainConfig.from_dict({"data": "digits", "lrr": 0.1})


@pytest.mark.parametrize("rule", ["contrastive", "eqprop", "lifted-j0", "pc", "lifted-fenchel", "fenchel-bp", "mac",
                                  "lpom"])
def test_resume_is_exact_for_every_rule(tmp_path, rule):
    """Rules keep no state between calls (no solver caches), so 1 + 1 resumed epochs equal 2 epochs
    exactly, metric for metric. Guards against state outside the checkpoint (the old λ cache)."""
    full = train(_cfg(tmp_path, "full", rule=rule, epochs=2, lr=0.05), progress=False, log=None)
    train(_cfg(tmp_path, "part", rule=rule, epochs=1, lr=0.05), progress=False, log=None)
    resumed = train(_cfg(tmp_path, "part", rule=rule, epochs=2, lr=0.05), progress=False, resume=True, log=None)
    assert _strip(full) == _strip(resumed)


def test_run_folder_guards(tmp_path):
    """A new run never silently overwrites another; --overwrite replaces it; leftover temporary files
    of an interrupted write are removed; damaged or missing files give one clear error naming them."""
    cfg = _cfg(tmp_path, "r", epochs=1)
    train(cfg, progress=False, log=None)
    with pytest.raises(RunFolderError, match="already holds a run"):
        train(cfg, progress=False, log=None)
    (tmp_path / "r" / ".checkpoint.pt.abc123.tmp").write_bytes(b"partial")
    train(cfg, progress=False, log=None, overwrite=True)
    assert not list((tmp_path / "r").glob(".*.tmp"))
    (tmp_path / "r" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunFolderError, match=r"checkpoint.pt is damaged.*delete it"):
        train(cfg.replace(epochs=2), progress=False, resume=True, log=None)
    (tmp_path / "r" / "config.json").write_text("{")
    from inferlearn.training.loop import load_config
    with pytest.raises(RunFolderError, match=r"config.json is damaged"):
        load_config(tmp_path / "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunFolderError, match=r"config.json does not exist: the run never started"):
        load_config(tmp_path / "empty")


def test_resume_without_checkpoint_restarts_with_a_note(tmp_path):
    """Killed before the first checkpoint: --resume starts the run from scratch and says so; a fresh folder (a new
    row of `reproduce`) starts without a note."""
    cfg = _cfg(tmp_path, "k", epochs=1)
    notes = []
    history = train(cfg, progress=False, resume=True, log=notes.append)
    assert history[-1]["epoch"] == 1 and not any("checkpoint" in n for n in notes)
    (tmp_path / "k" / "checkpoint.pt").unlink()   # as if killed before the first checkpoint
    history = train(cfg, progress=False, resume=True, log=notes.append)
    assert history[-1]["epoch"] == 1 and any("stopped before its first checkpoint" in n for n in notes)


def test_cli_refuses_options_dropped_by_resume(tmp_path, capsys):
    """An option given with --resume would be ignored: it is refused, naming the option."""
    from inferlearn.cli import main
    out = str(tmp_path / "c")
    assert main(["train", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--out", out, "--quiet"]) == 0
    assert main(["train", "--resume", out, "--lr", "0.3", "--quiet"]) == 2
    assert "--lr given with --resume" in capsys.readouterr().err
    assert main(["train", "--resume", out, "--epochs", "2", "--quiet"]) == 0
    assert main(["train", "--data", "digits", "--epochs", "0", "--out", str(tmp_path / "z"), "--quiet"]) == 2
    assert "Invalid epochs: 0" in capsys.readouterr().err


def test_validation_split_is_held_out_and_reported(tmp_path):
    """--val N holds out the *last* N training images (deterministic, never trained on), reports val_acc,
    and records val_size in config.json; limit_train then keeps the first images of the rest."""
    from inferlearn.data import load_dataset
    from inferlearn.training.loop import build, split_train

    assert split_train(100, 30, None) == (slice(0, 70), slice(70, 100))
    assert split_train(100, 30, 50) == (slice(0, 50), slice(70, 100))
    assert split_train(100, 30, 500) == (slice(0, 70), slice(70, 100))
    assert split_train(100, 0, None) == (slice(0, 100), slice(100, 100))
    data = load_dataset("digits")
    n = data.train_x.shape[0]
    s = build(_cfg(tmp_path, "b", val_size=300))
    assert s.train_x.shape[0] == n - 300 and s.val_x.shape[0] == 300
    assert s.val_x.equal(data.train_x[-300:]) and s.val_y.equal(data.train_y[-300:])
    assert s.train_x.equal(data.train_x[:n - 300])
    assert build(_cfg(tmp_path, "c")).val_x is None
    h = train(_cfg(tmp_path, "v", val_size=300, epochs=2), progress=False, log=None)
    assert all(0 <= r["val_acc"] <= 1 for r in h)
    assert json.loads((tmp_path / "v" / "config.json").read_text())["val_size"] == 300
    assert "val_acc" in read_jsonl(tmp_path / "v" / "metrics.jsonl")[-1]
    assert "val_acc" not in train(_cfg(tmp_path, "nv", epochs=1), progress=False, log=None)[-1]
    # the held-out images are never trained on: the same run on the first n-300 images alone is identical
    same = train(_cfg(tmp_path, "l", limit_train=n - 300, epochs=2), progress=False, log=None)
    assert [(r["train_loss"], r["test_acc"]) for r in same] == [(r["train_loss"], r["test_acc"]) for r in h]
    with pytest.raises(ValueError, match="leaves no training images"):
        build(_cfg(tmp_path, "e", val_size=n))
    with pytest.raises(ValueError, match="Invalid val_size"):
        _cfg(tmp_path, "f", val_size=-1)


def test_lr_defaults_to_the_rules_recommendation(tmp_path):
    """lr=None takes the rule's recommended rate for the optimiser; config.json records the number."""
    from inferlearn.rules import RULES, recommended_lr

    for name, cls in RULES.items():
        for opt in ("sgd", "adam"):
            assert recommended_lr(name, opt) == cls.recommended_lr[opt] > 0
    cfg = _cfg(tmp_path, "r", rule="pc", lr=None, epochs=1)
    assert cfg.resolved().lr == recommended_lr("pc", "sgd")
    assert cfg.replace(optimizer="adam").resolved().lr == recommended_lr("pc", "adam")
    assert cfg.replace(lr=0.01).resolved().lr == 0.01
    train(cfg, progress=False, log=None)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["lr"] == recommended_lr("pc", "sgd")
    with pytest.raises(ValueError, match="Unknown rule"):
        recommended_lr("nope", "sgd")


def test_float64_runs_start_from_the_float32_weights_and_resume_exactly(tmp_path):
    """``dtype="float64"`` trains a float64 model from the same initial weights as float32 (its first-epoch
    metrics agree to float32 round-off), keeps float64 in its checkpoint and resumes exactly."""
    import torch

    f32 = train(_cfg(tmp_path, "f32", rule="contrastive", epochs=1), progress=False, log=None)
    full = train(_cfg(tmp_path, "f64", rule="contrastive", dtype="float64", epochs=2), progress=False, log=None)
    assert abs(full[0]["train_loss"] - f32[0]["train_loss"]) < 1e-4 * f32[0]["train_loss"]
    ckpt = torch.load(tmp_path / "f64" / "checkpoint.pt", weights_only=False)
    assert all(v.dtype == torch.float64 for v in ckpt["model"].values() if v.is_floating_point())
    train(_cfg(tmp_path, "part", rule="contrastive", dtype="float64", epochs=1), progress=False, log=None)
    resumed = train(_cfg(tmp_path, "part", rule="contrastive", dtype="float64", epochs=2), progress=False,
                    resume=True, log=None)
    assert _strip(resumed) == _strip(full)
