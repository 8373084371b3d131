"""Reliability, round four (issue 34): a full disk loses nothing, no option is silently ignored, every file
read is validated, and every misuse of the Python API is refused in one line.

Every case is a real run or call. The command-line cases are one table (:data:`CLI_CASES`): the arguments and
the fragment the one-line message must hold; each must exit with code 2 and print no traceback.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import inferlearn.atomic as atomic
from inferlearn.cli import main

T = ["train", "--data", "digits", "--arch", "64-16-10", "--epochs", "3", "--quiet", "--limit-train", "200"]
A = ["admm", "--data", "digits", "--arch", "64-16-10", "--epochs", "3", "--quiet", "--limit-train", "200"]


def cli(args) -> tuple[int, str, str]:
    """Run the command line in this process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    except SystemExit as exc:   # argparse's own refusals
        rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc: int, err: str, *fragments: str) -> str:
    """Assert exit code 2 and one ``inferlearn: error:`` line holding every fragment; returns the line."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("inferlearn: error:"), err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def metrics(folder: Path) -> list[dict]:
    """``metrics.jsonl`` without the timings (which differ between runs)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]


# --------------------------------------------------------------------------------------------------------------
# 1. A full disk (or an I/O error) on every write


class _FullDisk:
    """A file object whose ``write`` puts half of the bytes on disk, then fails with ``ENOSPC``."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def write(self, data):
        self.fh.write(bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, key):
        return getattr(self.fh, key)


def fill_disk(monkeypatch, name: str, after: int = 0, code: int = errno.ENOSPC) -> None:
    """Make the writes of files whose name contains ``name`` (a temporary ``.NAME.*.tmp`` of an atomic write, or
    an appended file) fail, after the first ``after`` of them succeed."""
    real, seen = open, [0]

    def fake_open(path, mode="r", *args, **kwargs):
        fh = real(path, mode, *args, **kwargs)
        if name in Path(path).name and any(m in mode for m in "wa"):
            seen[0] += 1
            if seen[0] > after:
                if code == errno.ENOSPC:
                    return _FullDisk(fh)
                fh.close()
                raise OSError(code, os.strerror(code))
        return fh

    monkeypatch.setattr(atomic, "open", fake_open, raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 3-epoch train and admm runs, to compare resumed runs with."""
    root = tmp_path_factory.mktemp("reference")
    assert cli([*T, "--out", root / "train"])[0] == 0
    assert cli([*A, "--out", root / "admm"])[0] == 0
    return root


@pytest.mark.parametrize("command", ["train", "admm"])
@pytest.mark.parametrize("target, after", [("checkpoint.pt", 1), ("metrics.jsonl", 2), ("curves.png", 0)])
def test_full_disk_loses_nothing_and_resumes_exactly(reference, tmp_path, monkeypatch, command, target, after):
    """The write of epoch 2's checkpoint (or its metrics line, or the final plot) meets a full disk: one line
    naming the file, the space needed and how to continue; the previous files are intact (a cut metrics line is
    removed); ``--resume`` then gives the uninterrupted run's metrics."""
    base = T if command == "train" else A
    out = tmp_path / "run"
    fill_disk(monkeypatch, target, after=after)
    rc, _, err = cli([*base, "--out", out])
    line = one_line_error(rc, err, f"Cannot write {out / target}", "the disk is full", "free on",
                          f"inferlearn {command} --resume {out}")
    assert "needs about" in line
    assert not list(out.glob(".*.tmp")), "a temporary file was left behind"
    done = metrics(out)
    expect = metrics(reference / command)
    assert done == expect[:len(done)] and len(done) >= 1 and all(json.loads(x) for x in
                                                                    (out / "metrics.jsonl").read_text().splitlines())
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["epoch"] in (1, 2, 3)
    monkeypatch.undo()
    rc, _, err = cli([command, "--resume", out, "--quiet"])
    assert rc == 0, err
    assert metrics(out) == expect


def test_io_error_names_the_file(tmp_path, monkeypatch):
    """An I/O error other than a full disk names the file and the error (no free-space advice)."""
    fill_disk(monkeypatch, "config.json", code=errno.EIO)
    out = tmp_path / "run"
    rc, _, err = cli([*T, "--out", out])
    one_line_error(rc, err, f"Cannot write {out / 'config.json'}", "Input/output error")


@pytest.mark.parametrize("after", [0, 3], ids=["first-event", "mid-run"])
def test_tensorboard_on_a_full_disk(tmp_path, monkeypatch, after):
    """TensorBoard's background writer meets a full disk (at its first event, or after a few): one line naming
    the log folder, no thread traceback; the run folder is intact and resumes."""
    pytest.importorskip("tensorboard")
    from tensorboard.summary.writer import record_writer

    real, seen = record_writer.RecordWriter.write, [0]

    def full(self, data):
        seen[0] += 1
        if seen[0] > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    out, board = tmp_path / "run", tmp_path / "tb"
    rc, _, err = cli([*T, "--out", out, "--tensorboard", board])
    one_line_error(rc, err, f"Cannot write {board}", "the disk is full")
    assert "Exception in thread" not in err
    monkeypatch.undo()
    if (out / "checkpoint.pt").exists():
        assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] >= 1
    assert cli(["train", "--resume", out, "--quiet"])[0] == 0


# --------------------------------------------------------------------------------------------------------------
# 2-5. The command-line table: inert options, repeated keys, unvalidated files, late refusals
#
# Placeholders name files the fixture prepares: PROTO_LIST (a protocol JSON holding a list), PROTO_TYPE (one whose
# val_size is a string), TINY (a valid protocol), REUSE_ROWS (a results.json of TINY with malformed rows), EDITED
# (a run folder whose config.json was edited by hand: epochs "ten"), EDITED_OPT (one with a bad rule option).

D = ["--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--quiet", "--limit-train", "100"]
TR = ["train", *D]
TINY = {"name": "tiny", "summary": "a test protocol", "data": "digits", "arch": "64-16-10", "val_size": 100,
        "train": {"epochs": 1, "limit_train": 100}, "variants": [{"name": "bp", "rule": "backprop"}]}
CLI_CASES = [
    # 2. no option silently ignored
    (TR + ["--optimizer", "adamw", "--momentum", "0.9"], "--momentum 0.9 has no effect with --optimizer adamw"),
    (TR + ["--optimizer", "adam", "--momentum", "0.9"], "--momentum 0.9 has no effect with --optimizer adam"),
    (["admm", *D, "--optimizer", "adam", "--momentum", "0.9"], "--momentum 0.9 has no effect with --optimizer adam"),
    (["compare", *D, "--rules", "pc", "--optimizer", "adam", "--momentum", "0.5"], "has no effect with --optimizer adam"),
    (TR + ["--rule", "pc", "--rule-opt", "inference_momentum=0.5"],
     "Invalid inference_momentum: 0.5 has no effect with inference_optimizer='sgd'"),
    (TR + ["--rule", "pc", "--rule-opt", "beta=0"], "Invalid beta: 0.0 has no effect with nudging='clamp'"),
    (TR + ["--rule", "epc", "--rule-opt", "beta=0.5"], "Invalid beta: 0.5 has no effect with nudging='clamp'"),
    (TR + ["--rule", "contrastive", "--rule-opt", "gamma=1/8", "--rule-opt", "gamma=1/4"],
     "Rule option 'gamma' of contrastive given twice (gamma=1/8 and gamma=1/4)"),
    (["compare", *D, "--rules", "pc", "--rule-opt", "pc.steps=5", "--rule-opt", "pc.steps=9"],
     "Rule option 'steps' of pc given twice"),
    (TR + ["--augment", "crop-flip"], "--augment crop-flip on digits mirrors digits"),
    (TR + ["--data", "mnist", "--arch", "784-16-10", "--augment", "crop-flip"], "crop-flip:force to flip them anyway"),
    # 3. every file read is validated, every option before the first epoch
    (["benchmark", "PROTO_LIST"], "holds a list [...], not an object {...} of Protocol keys"),
    (["benchmark", "PROTO_TYPE"], "'val_size' is a string ('300'), not an integer"),
    (["benchmark", "TINY", "--budget", "full", "--reuse", "REUSE_ROWS"], "variants[0].search[0] key 'point' must be"),
    (["train", "--resume", "EDITED"], "config.json holds invalid settings (key 'epochs' is a string ('ten'), not an "
                                      "integer"),
    (["train", "--resume", "EDITED_OPT"], "config.json holds invalid settings (Invalid steps"),
    (["reproduce", "lifted", "--table", "1", "--solver", "nosuch", "--epochs", "1", "--limit-train", "50",
      "--acts", "relu", "--out", "OUT"], "solver"),
    (["reproduce", "lifted", "--table", "1", "--acts", "relu,swish", "--epochs", "1", "--out", "OUT"],
     "Unknown unit type 'swish'"),
]
FILES = ("PROTO_LIST", "PROTO_TYPE", "TINY", "REUSE_ROWS", "EDITED", "EDITED_OPT")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    (root / "PROTO_LIST").write_text(json.dumps([TINY]))
    (root / "PROTO_TYPE").write_text(json.dumps(TINY | {"val_size": "300"}))
    (root / "TINY").write_text(json.dumps(TINY))
    (root / "REUSE_ROWS").write_text(json.dumps({"protocol": "tiny", "budget": "full", "budget_width": 1.0,
                                                 "budget_epochs": 1.0, "variants": [
                                                     {"variant": "bp", "rule": "backprop", "options": {},
                                                      "search": [{"val_acc": [0.5]}], "chosen": None, "finals": []}]}))
    assert cli([*TR, "--out", root / "EDITED"])[0] == 0
    shutil.copytree(root / "EDITED", root / "EDITED_OPT")
    for name, change in (("EDITED", {"epochs": "ten"}), ("EDITED_OPT", {"rule": "pc", "rule_options": {"steps": -3}})):
        cfg = json.loads((root / name / "config.json").read_text())
        (root / name / "config.json").write_text(json.dumps(cfg | change))
    return root


@pytest.mark.parametrize("args, fragment", CLI_CASES, ids=[f"{i}:{' '.join(c[0][-2:])}" for i, c in enumerate(CLI_CASES)])
def test_cli_refuses_in_one_line(files, tmp_path, args, fragment):
    """Exit code 2, one line holding the fragment, no traceback, and nothing trained or written for a new run."""
    args = [files / a if a in FILES else tmp_path / "out" if a == "OUT" else a for a in args]
    if args[0] in ("train", "admm", "compare", "benchmark") and "--resume" not in args:
        args += ["--out", tmp_path / "out"]
    rc, _, err = cli(args)
    line = one_line_error(rc, err, fragment)
    if args[0] == "reproduce":
        assert "nosuch" in line or "swish" in line
    assert not list((tmp_path / "out").rglob("metrics.jsonl")), "something trained before the refusal"
    assert "has no checkpoint yet" not in err


def test_resumed_folder_keeps_its_files_after_a_refusal(files):
    """A refused --resume of a hand-edited config.json changes nothing in the folder."""
    before = (files / "EDITED" / "metrics.jsonl").read_bytes()
    assert cli(["train", "--resume", files / "EDITED"])[0] == 2
    assert (files / "EDITED" / "metrics.jsonl").read_bytes() == before


@pytest.mark.parametrize("args, fragment", [
    (TR + ["--rule", "mac", "--compile", "on"], "--compile on: rule 'mac' has no compiled step for '64-16-10'"),
    (TR + ["--threads", "1000"], "--threads 1000 is more than this machine's"),
], ids=["compile-on-mac", "threads-1000"])
def test_inert_speed_options_warn_in_one_line(tmp_path, args, fragment):
    """Options that only change speed warn (refusing would break scripts that pass them everywhere): one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        rc, _, err = cli(args + ["--out", tmp_path / "out"])
    assert rc == 0, err
    hits = [line for line in err.splitlines() if fragment in line]
    assert len(hits) == 1 and hits[0].startswith("inferlearn: warning:"), err


def test_compile_on_with_a_compiled_step_does_not_warn(tmp_path):
    """Predictive coding has a compiled step: --compile on says nothing (or fails over to eager with its own
    warning where no compiler is installed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        rc, _, err = cli(TR + ["--rule", "pc", "--compile", "on", "--out", tmp_path / "out"])
    assert rc == 0, err
    assert "has no compiled step" not in err


def test_pc_cross_entropy_says_what_its_loss_is(tmp_path):
    """The epoch line labels the squared error, and PC with output=ce says once that it trains another loss."""
    rc, out, err = cli(TR + ["--rule", "pc", "--rule-opt", "output=ce", "--out", tmp_path / "ce"])
    assert rc == 0, err
    assert "sq-loss" in out and out.count("trains the cross-entropy of softmax(output)") == 1
    rc, out, _ = cli(TR + ["--rule", "pc", "--out", tmp_path / "se"])
    assert "sq-loss" in out and "cross-entropy" not in out


def test_reproduce_says_nothing_of_checkpoints_for_fresh_rows(tmp_path, mnist_dir):
    """A fresh reproduction used to print 'has no checkpoint yet; starting the run from scratch' for every row; a
    row interrupted before its first checkpoint still says so."""
    args = ["reproduce", "lifted", "--table", "1", "--acts", "relu", "--rows", "backprop", "--epochs", "1",
            "--limit-train", "100", "--data-dir", mnist_dir, "--out", tmp_path]
    rc, out, err = cli(args)
    assert rc == 0, err
    assert "checkpoint" not in out + err
    run = tmp_path / "table1" / "relu" / "backprop"
    (run / "checkpoint.pt").unlink()
    rc, out, err = cli(args)
    assert rc == 0 and "stopped before its first checkpoint; starting it from scratch" in out + err


def test_help_of_compile_says_what_auto_does():
    rc, out, _ = cli(["train", "--help"])
    text = " ".join(out.split())
    assert "off on CPU" not in text and "on CPU only predictive coding's and ePC's steps" in text


# --------------------------------------------------------------------------------------------------------------
# 4. The Python API


def test_mac_index_out_of_range_is_refused_before_allocating():
    from inferlearn.models import MLP
    from inferlearn.rules import make_rule

    model, rule = MLP([8, 16, 3], "relu"), make_rule("mac", {})
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    with pytest.raises(ValueError, match=r"Invalid index: sample position 1000000007 is beyond what fits in memory"):
        rule.backward(model, x, y, index=torch.arange(8) + 10 ** 9)
    assert rule.state_dict()["z"] is None, "it allocated before refusing"
    rule.begin_epoch(1, 100)
    with pytest.raises(ValueError, match=r"position 107 is beyond the 100 training samples"):
        rule.backward(model, x, y, index=torch.arange(8) + 100)
    assert math.isfinite(rule.backward(model, x, y, index=torch.arange(8) + 92).loss)


@pytest.mark.parametrize("declare", ["declare_affine", "declare_map"])
def test_declarations_take_modules_only(declare):
    import inferlearn

    with pytest.raises(TypeError, match=f"{declare} takes an nn.Module, got function"):
        getattr(inferlearn, declare)(lambda t: t)


@pytest.mark.parametrize("arch", ["vgg5", "vgg7", "resnet20", "conv:4"])
def test_image_models_need_an_image_shape(arch):
    from inferlearn.models import build_model

    with pytest.raises(ValueError, match=r"needs image_shape \(C, H, W\), the shape of one image, e\.g\. \(3, 32, 32\)"):
        build_model(arch, "relu", 64, 10, (64,))


@pytest.mark.parametrize("arch", ["vgg5:width=0.0625", "resnet20:width=0.25", "conv:4"])
@pytest.mark.parametrize("rule", ["backprop", "pc"])
def test_image_models_take_images_or_flat_rows(arch, rule):
    """Image-shaped input (B, 3, 32, 32) gives what the flat rows (B, 3072) give; any other shape one line."""
    from inferlearn.models import build_model
    from inferlearn.rules import make_rule

    model = build_model(arch, "relu", 3072, 10, (3, 32, 32)).double()
    x, y = torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (4,))
    grads = []
    for inputs in (x, x.reshape(4, -1)):
        model.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # PC far from equilibrium on a deep net: beside the point here
            make_rule(rule, {}).backward(model, inputs, y)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"takes flat rows \(batch, 3072\) or images \(batch, 3, 32, 32\); got inputs "
                                         r"of shape \(4, 3, 28, 28\)"):
        model(torch.randn(4, 3, 28, 28, dtype=torch.float64))


class _SharedFC(nn.Module):
    """A traced model whose ``fc`` is used twice (shared weights)."""

    def __init__(self):
        super().__init__()
        self.inp, self.fc, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.relu(self.fc(torch.relu(self.inp(x)))))))


def _shared_sequential():
    fc = nn.Linear(8, 8)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), fc, nn.ReLU(), fc, nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("build, name", [(_SharedFC, "fc"), (_shared_sequential, "2")], ids=["traced", "sequential"])
@pytest.mark.parametrize("rule", ["pc", "epc", "mac", "lpom", "contrastive", "eqprop", "lifted-j0"])
def test_shared_weights_are_refused_by_name_for_the_energy_rules(build, name, rule):
    from inferlearn.rules import make_rule

    with pytest.raises(ValueError, match=f"module '{name}' is used twice; inference-learning rules need one use per "
                                         "module"):
        make_rule(rule, {}).backward(build(), torch.randn(5, 8), torch.randint(0, 3, (5,)))


@pytest.mark.parametrize("build", [_SharedFC, _shared_sequential], ids=["traced", "sequential"])
def test_shared_weights_train_with_backprop(build):
    """Back-propagation takes shared weights: its gradient is autograd's (the two uses summed)."""
    from inferlearn.losses import one_hot, quadratic_loss
    from inferlearn.rules import make_rule

    model, x, y = build().double(), torch.randn(5, 8, dtype=torch.float64), torch.randint(0, 3, (5,))
    make_rule("backprop", {}).backward(model, x, y)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    quadratic_loss(model(x), one_hot(y, 3, x.dtype)).backward()
    for a, p in zip(got, model.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_inert_python_options_raise_value_error():
    from inferlearn.rules import make_rule
    from inferlearn.training.config import TrainConfig

    with pytest.raises(ValueError, match="--momentum 0.9 has no effect with --optimizer adamw"):
        TrainConfig(optimizer="adamw", momentum=0.9)
    with pytest.raises(ValueError, match="Invalid inference_momentum: 0.5 has no effect"):
        make_rule("pc", {"inference_momentum": 0.5})
    with pytest.raises(ValueError, match="Invalid beta: 0 has no effect with nudging='clamp'"):
        make_rule("pc", {"beta": 0})
    assert make_rule("pc", {"inference_optimizer": "momentum", "inference_momentum": 0.5})
    assert make_rule("pc", {"nudging": "positive", "beta": 0.05})
    with pytest.raises(ValueError, match="crop-flip on mnist mirrors digits"):
        TrainConfig(data="mnist", arch="784-10", augment="crop-flip")
    assert TrainConfig(data="mnist", arch="784-10", augment="crop-flip:force")
    assert TrainConfig(data="fashion-mnist", arch="784-10", augment="crop-flip")


# --------------------------------------------------------------------------------------------------------------
# 6. Defaults that train: every rule of ./scripts/demo.sh well above chance


def demo_arguments() -> list[str]:
    """The arguments ./scripts/demo.sh gives ``inferlearn compare`` (its settings, not a copy of them)."""
    text = (Path(__file__).resolve().parents[2] / "scripts" / "demo.sh").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("exec ") and "inferlearn compare" in line)
    args = line.split("inferlearn compare", 1)[1].replace('"$@"', "").split()
    i = args.index("--out")
    return args[:i] + args[i + 2:]


@pytest.mark.slow
def test_every_demo_rule_trains_well_above_chance(tmp_path):
    """The README's main job: on digits (chance 10 %), every rule of the demo's table reaches at least 50 % test
    accuracy at its defaults or its recipe named in the table's options column (MAC used to end at 8 %)."""
    rc, out, err = cli(["compare", *demo_arguments(), "--out", tmp_path])
    assert rc == 0, err
    rows = json.loads((tmp_path / "comparison.json").read_text())["rules"]
    low = {r["rule"]: r["test_acc"] for r in rows if not r["test_acc"] >= 0.5}
    assert len(rows) >= 10 and not low, low
    table = (tmp_path / "comparison.md").read_text()
    assert "| mac | mu_max=10 |" in table


def test_full_disk_while_the_benchmark_writes_its_table(tmp_path, monkeypatch):
    """A full disk when the benchmark writes results.md: one line naming it; the finished runs and the previous
    table stay, and the rerun (disk freed) skips every finished run and writes the table."""
    spec = {"name": "disk", "summary": "full disk", "data": "digits", "arch": "64-16-10", "val_size": 300,
            "train": {"epochs": 1, "batch_size": 50, "optimizer": "sgd", "lr": 0.3, "limit_train": 200},
            "variants": [{"name": "bp", "rule": "backprop"}]}
    path, out = tmp_path / "disk.json", tmp_path / "bench"
    path.write_text(json.dumps(spec))
    args = ["benchmark", path, "--budget", "full", "--seeds", "2", "--out", out, "--quiet"]
    fill_disk(monkeypatch, "results.md", after=1)   # the table after seed 0 is written, the one after seed 1 is not
    rc, _, err = cli(args)
    one_line_error(rc, err, f"Cannot write {out / 'results.md'}", "the disk is full")
    assert "Partial" in (out / "results.md").read_text() and (out / "final" / "bp" / "seed1" / "metrics.jsonl").exists()
    monkeypatch.undo()
    rc, stdout, err = cli(args)
    assert rc == 0, err
    assert stdout.count("finished earlier, skipped") == 2 and "Partial" not in (out / "results.md").read_text()
