"""A table of bad command-line inputs: every one ends with a non-zero exit and one clear line (the value,
and what to do), never a traceback. Each row is (arguments, the fragment the message must contain).

Placeholders name run folders the fixture prepares: RUN (a finished train run), ADMMRUN (a finished
admm run), EMPTY (an empty folder), BADJSON (a truncated config.json), BADCKPT (a damaged checkpoint),
BADCFG (a config.json with an invalid value), OTHERARCH (a run whose checkpoint was written for another
architecture). ``bad_models:NAME`` are user model builders that fail in the ways a user's can
(``tests/bad_models.py``). A refused new run leaves no output folder behind.
"""
import contextlib
import io
import json
import shutil

import pytest

from inferlearn.cli import main

T = ["train", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--quiet", "--limit-train", "100"]
A = ["admm", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--quiet", "--limit-train", "100"]
C = ["compare", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--quiet", "--limit-train", "100"]
CASES = [
 # train: data/arch/act
 (T + ["--data", "imagenet"], "Unknown dataset 'imagenet'"),
 (T + ["--arch", "64-abc-10"], "Invalid architecture"),
 (T + ["--arch", "64"], "Invalid architecture"),
 (T + ["--arch", "64-0-10"], "Invalid architecture"),
 (T + ["--arch", "64--10"], "Invalid architecture"),
 (T + ["--arch", "100-16-10"], "does not fit digits"),
 (T + ["--arch", "64-16-7"], "does not fit digits"),
 (T + ["--arch", "conv:"], "Invalid conv architecture"),
 (T + ["--arch", "conv:a-b"], "Invalid conv architecture"),
 (T + ["--arch", "conv:4-0"], "Invalid conv architecture"),
 (T + ["--arch", "conv:4/x"], "Invalid conv architecture"),
 (T + ["--arch", "conv:4-4-4-4-4"], "Too many conv stages"),
 (T + ["--arch", "nosuchmodule:build"], "Cannot load model builder"),
 (T + ["--arch", "os:getcwd"], "not an nn.Module"),
 (T + ["--arch", ":build"], "Invalid model builder"),
 (T + ["--act", "swish"], "Unknown unit type 'swish'"),
 (T + ["--act", ""], "Unknown unit type"),
 # optimisation
 (T + ["--lr", "0"], "Invalid learning rate: 0"),
 (T + ["--val", "-5"], "Invalid val_size: -5"),
 (T + ["--val", "5000"], "--val 5000 leaves no training images"),
 (T + ["--lr", "-1"], "Invalid learning rate: -1"),
 (T + ["--lr", "nan"], "Invalid learning rate: nan"),
 (T + ["--lr", "inf"], "Invalid learning rate: inf"),
 (T + ["--lr", "abc"], "invalid float value: 'abc'"),
 (T + ["--momentum", "1"], "Invalid momentum: 1"),
 (T + ["--momentum", "-0.5"], "Invalid momentum: -0.5"),
 (T + ["--momentum", "nan"], "Invalid momentum: nan"),
 (T + ["--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
 (T + ["--epochs", "0"], "Invalid epochs: 0"),
 (T + ["--epochs", "-3"], "Invalid epochs: -3"),
 (T + ["--epochs", "x"], "invalid int value: 'x'"),
 (T + ["--batch-size", "0"], "Invalid batch_size: 0"),
 (T + ["--batch-size", "-5"], "Invalid batch_size: -5"),
 (T + ["--limit-train", "0"], "Invalid limit_train: 0"),
 (T + ["--limit-train", "-1"], "Invalid limit_train: -1"),
 (T + ["--seed", "-1"], "Invalid seed: -1"),
 (T + ["--seed", "1.5"], "invalid int value: '1.5'"),
 (T + ["--seed", "1180591620717411303424"], "Invalid seed: 1180591620717411303424 (must be an integer in 0 …"),
 (A + ["--seed", "1180591620717411303424"], "Invalid --seed 1180591620717411303424"),
 (T + ["--init-scale", "0"], "Invalid init_scale: 0"),
 (T + ["--init-scale", "nan"], "Invalid init_scale: nan"),
 (T + ["--lr-schedule", "linear"], "Invalid lr schedule 'linear'"),
 (T + ["--lr-schedule", "cosine:-1"], "Invalid lr schedule 'cosine:-1'; use cosine:W"),
 (T + ["--lr-schedule", "cosine:1"], "'cosine:1': 1 warm-up epochs leave none of the 1 epochs"),
 (T + ["--weight-decay", "-0.1"], "Invalid weight_decay: -0.1"),
 (T + ["--weight-decay", "inf"], "Invalid weight_decay: inf"),
 (T + ["--augment", "flip"], "invalid choice: 'flip'"),
 (C + ["--standardize", "yes"], "invalid choice: 'yes'"),
 (T + ["--lr-schedule", "scaled:0"], "Invalid lr schedule 'scaled:0'"),
 (T + ["--lr-schedule", "scaled:abc"], "Invalid lr schedule 'scaled:abc'"),
 (T + ["--lr-schedule", "warmup:5:0:0.1"], "Invalid lr schedule 'warmup:5:0:0.1'"),
 (T + ["--device", "mps"], "Unsupported device 'mps'"),
 (T + ["--threads", "0"], "Invalid --threads 0"),
 (A + ["--threads", "-1"], "Invalid --threads -1"),
 (T + ["--device", "cuda"], "CUDA is not available"),
 (T + ["--device", "tpu"], "Unsupported device 'tpu'"),
 (T + ["--data-dir", "/nonexistent"], "--data-dir /nonexistent is not a folder"),
 (T + ["--out", "/etc/passwd"], "is a file"),
 (T + ["--out", "/proc/nope/x"], "Cannot write to output folder"),
 (T + ["--tensorboard", "/proc/nope/tb"], "Cannot write TensorBoard logs to /proc/nope/tb"),
 (T + ["--tensorboard", "/etc/passwd"], "--tensorboard /etc/passwd is a file"),
 (C + ["--tensorboard", "/etc/passwd"], "--tensorboard /etc/passwd is a file"),
 (A + ["--tensorboard", "/etc/passwd"], "--tensorboard /etc/passwd is a file"),
 # the user's own model
 (T + ["--arch", "bad_models:raising"], "Building the model 'bad_models:raising' failed: RuntimeError: my builder"),
 (T + ["--arch", "bad_models:forward_raises"], "The model 'bad_models:forward_raises' fails on digits inputs"),
 (T + ["--arch", "bad_models:wrong_width"], "The model 'bad_models:wrong_width' fails on digits inputs of shape (2, 64)"),
 (T + ["--arch", "bad_models:wrong_outputs"], "to (2, 7); expected (batch, 10)"),
 (T + ["--arch", "bad_models:on_meta"], "has tensors on the meta device"),
 (T + ["--arch", "bad_models:frozen"], "has no trainable parameters"),
 (T + ["--arch", "bad_models:no_parameters", "--rule", "pc"], "has no trainable parameters"),
 # rules and options
 (T + ["--rule", "nope"], "Unknown rule 'nope'"),
 (T + ["--rule", ""], "Unknown rule ''"),
 (T + ["--rule-opt", "gamma=1"], "Unknown option 'gamma' for rule 'backprop'"),
 (T + ["--rule-opt", "gamma"], "Invalid --rule-opt 'gamma': expected KEY=VALUE"),
 (T + ["--rule-opt", "=1"], "Invalid --rule-opt '=1': expected KEY=VALUE"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=0"], "Invalid gamma: 0"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=-1"], "Invalid gamma: -1"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=abc/8"], "Invalid value 'abc/8' for option 'gamma'"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=1/0"], "Invalid value '1/0' for option 'gamma'"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=nan"], "Invalid gamma: nan"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=inf"], "Invalid gamma: inf"),
 (T + ["--rule", "contrastive", "--rule-opt", "gamma=__import__('os')"], "Invalid value"),
 (T + ["--rule", "contrastive", "--rule-opt", "solver=magic"], "Unknown solver 'magic'"),
 (T + ["--rule", "contrastive", "--rule-opt", "max_iter=0"], "Invalid max_iter: 0"),
 (T + ["--rule", "contrastive", "--rule-opt", "max_iter=1.5"], "Invalid value '1.5' for option 'max_iter'"),
 (T + ["--rule", "contrastive", "--rule-opt", "tol=0"], "Invalid tol: 0"),
 (T + ["--rule", "contrastive", "--rule-opt", "tol=-1"], "Invalid tol: -1"),
 (T + ["--rule", "contrastive", "--rule-opt", "on_fail=explode"], "Invalid on_fail: 'explode'"),
 (T + ["--rule", "contrastive", "--rule-opt", "engine=turbo"], "Invalid engine: 'turbo'"),
 (T + ["--rule", "contrastive", "--rule-opt", "gama=1"], "Unknown option 'gama' for rule 'contrastive'"),
 (T + ["--rule", "eqprop", "--rule-opt", "beta=0"], "Invalid beta: 0"),
 (T + ["--rule", "eqprop", "--rule-opt", "beta=-0.1"], "Invalid beta: -0.1"),
 (T + ["--rule", "eqprop", "--rule-opt", "nudging=sideways"], "Invalid nudging: 'sideways'"),
 (T + ["--rule", "eqprop", "--rule-opt", "loss=hinge"], "Unknown loss 'hinge'"),
 (T + ["--rule", "fenchel-bp", "--rule-opt", "beta=0"], "Invalid beta: 0"),
 (T + ["--rule", "fenchel-bp", "--rule-opt", "beta=inf"], "Invalid beta: inf"),
 (T + ["--rule", "fenchel-bp", "--rule-opt", "loss=l1"], "Unknown loss 'l1'"),
 (T + ["--rule", "backprop", "--rule-opt", "loss=l1"], "Unknown loss 'l1'"),
 (T + ["--rule", "backprop", "--rule-opt", "fused=maybe"], "Invalid value 'maybe' for option 'fused'"),
 (T + ["--rule", "pc", "--rule-opt", "steps=-1"], "Invalid steps: -1"),
 (T + ["--rule", "pc", "--rule-opt", "steps=x"], "Invalid value 'x' for option 'steps'"),
 (T + ["--rule", "pc", "--rule-opt", "step_size=0"], "Invalid step_size: 0"),
 (T + ["--rule", "pc", "--rule-opt", "step_size=1e100"], "Invalid step_size: 1e+100 (must be < 2"),
 (T + ["--rule", "pc", "--rule-opt", "output_weight=0"], "Invalid output_weight: 0"),
 (T + ["--rule", "pc", "--rule-opt", "tol=0"], "Invalid tol: 0"),
 (T + ["--rule", "pc", "--rule-opt", "engine=x"], "Invalid engine: 'x'"),
 (T + ["--rule", "lifted-fenchel", "--rule-opt", "step_size=2"], "Invalid step_size: 2"),
 (T + ["--rule", "lifted-fenchel", "--rule-opt", "steps=-2"], "Invalid steps: -2"),
 (T + ["--rule", "lifted-fenchel", "--rule-opt", "gamma=0"], "Invalid gamma: 0"),
 (T + ["--rule", "lifted-j0", "--rule-opt", "scaling=weird"], "Invalid scaling: 'weird'"),
 (T + ["--rule", "lifted-j0", "--rule-opt", "warmup_epochs=3"], "Unknown option 'warmup_epochs'"),
 (T + ["--rule", "contrastive", "--rule-opt", "solver=cd", "--arch", "conv:2-4"], "runs on dense chains only"),
 (T + ["--rule", "contrastive", "--rule-opt", "engine=fused", "--arch", "conv:2-4"], "engine='fused' needs a dense chain"),
 # resume
 (["train", "--resume", "/nonexistent/run"], "does not exist"),
 (["train", "--resume", "RUN", "--lr", "0.5"], "--lr given with --resume"),
 (["train", "--resume", "RUN", "--rule", "pc"], "--rule given with --resume"),
 (["train", "--resume", "RUN", "--arch", "64-8-10"], "--arch given with --resume"),
 (["train", "--resume", "RUN", "--epochs", "0"], "Invalid epochs: 0"),
 (["train", "--resume", "EMPTY"], "config.json does not exist"),
 (["train", "--resume", "BADJSON"], "config.json is damaged"),
 (["train", "--resume", "BADCKPT", "--epochs", "3"], "is damaged"),
 (["train", "--resume", "ADMMRUN"], "not the config of an `inferlearn train` run"),
 (["train", "--resume", "BADCFG"], "holds invalid settings"),
 (["train", "--resume", "OTHERARCH", "--epochs", "2"], "does not fit the model '64-8-10' builds now (size mismatch"),
 (["train", "--resume", "RUN", "--epochs", "2", "--tensorboard", "/etc/passwd"], "--tensorboard /etc/passwd is a file"),
 (T + ["--out", "RUN"], "already holds a run"),
 # compare
 (C + ["--rules", "backprop,nope"], "Unknown rules ['nope']"),
 (C + ["--rules", ""], "names no rule"),
 (C + ["--rule-opt", "gamma=1"], "RULE.KEY=VALUE"),
 (C + ["--rule-opt", "contrastive.gama=1"], "Unknown option 'gama'"),
 (C + ["--rule-lr", "backprop=abc"], "Invalid --rule-lr 'backprop=abc'"),
 (C + ["--rule-lr", "backprop"], "Invalid --rule-lr 'backprop'"),
 (C + ["--rule-lr", "backprop=-1"], "Invalid learning rate"),
 (C + ["--rules", "contrastive", "--rule-lr", "pc=0.1"], "--rule-lr names pc, which is not compared"),
 (C + ["--rules", "contrastive", "--rule-opt", "pc.steps=5"], "--rule-opt names pc, which is not compared"),
 (C + ["--out", "RUN"], "holds another run (not a comparison)"),
 (C + ["--out", "ADMMRUN"], "holds another run (not a comparison)"),
 (C + ["--out", ""], "Invalid --out ''"),
 # benchmark
 (["benchmark", "imagenet-sota"], "Unknown protocol 'imagenet-sota'"),
 (["benchmark", "mlp-mnist", "--budget", "0"], "Invalid --budget '0'"),
 (["benchmark", "mlp-mnist", "--budget", "huge"], "Invalid --budget 'huge'"),
 (["benchmark", "mlp-mnist", "--seeds", "-1"], "Invalid --seeds -1"),
 (["benchmark", "mlp-mnist", "--device", "tpu"], "Unsupported device 'tpu'"),
 (["benchmark", "mlp-mnist", "--data-dir", "/nonexistent/data"], "--data-dir /nonexistent/data is not a folder"),
 (["benchmark", "mlp-mnist", "--out", "RUN"], "holds a training run, not a benchmark"),
 (["benchmark", "mlp-mnist", "--out", ""], "Invalid --out ''"),
 (["benchmark", "/nonexistent/protocol.json"], "does not exist"),
 (T + ["--out", ""], "Invalid --out ''"),
 (A + ["--out", ""], "Invalid --out ''"),
 (["train", "--resume", ""], "Invalid --resume ''"),
 (["admm", "--resume", ""], "Invalid --resume ''"),
 # admm
 (A + ["--split", "abc"], "Invalid --split 'abc'"),
 (A + ["--arch", "conv:abc"], "Invalid --arch 'conv:abc'"),
 (A + ["--arch", "conv:4-0"], "Invalid --arch 'conv:4-0'"),
 (A + ["--limit-train", "0"], "Invalid --limit-train 0"),
 (A + ["--split", "99"], "Invalid split point 99"),
 (A + ["--epochs", "0"], "Invalid --epochs 0"),
 (A + ["--act", "softmax"], "Unknown activation 'softmax'"),
 (A + ["--beta", "nan"], "Invalid beta: nan"),
 (A + ["--beta", "abc"], "Invalid --beta 'abc'"),
 (A + ["--beta", "-1"], "Invalid beta: -1"),
 (A + ["--zeta", "0"], "Invalid zeta: 0.0"),
 (A + ["--lr", "0"], "Invalid lr: 0.0"),
 (A + ["--batch-size", "0"], "Invalid batch_size: 0"),
 (A + ["--shift", "2"], "needs --mode online"),
 (A + ["--nmf-rank", "0"], "Invalid NMF rank 0"),
 (A + ["--nmf-rank", "4", "--nmf-after", "9"], "Invalid --nmf-after 9"),
 (A + ["--mode", "stream"], "invalid choice: 'stream'"),
 (A + ["--data", "imagenet"], "Unknown dataset 'imagenet'"),
 (A + ["--arch", "64-16-7"], "but digits has 10 classes"),
 (A + ["--device", "mps"], "Unsupported device 'mps'"),
 (["admm", "--resume", "/nonexistent/run"], "does not exist"),
 (["admm", "--resume", "RUN"], "not the config of an `inferlearn admm` run"),
 (["admm", "--resume", "ADMMRUN", "--lr", "0.5"], "--lr given with --resume"),
 (["admm", "--resume", "ADMMRUN", "--mode", "online"], "--mode given with --resume"),
 (A + ["--out", "ADMMRUN"], "already holds a run"),
 # data
 (["data", "fetch", "imagenet"], "Unknown dataset 'imagenet'"),
 (["data", "list", "--data-dir", "/nonexistent"], "--data-dir /nonexistent is not a folder"),
 (["reproduce", "lifted", "--table", "9"], "argument --table: invalid choice: 9"),
 (["reproduce", "lifted", "--table", "1", "--figure", "1"], "--table and --figure given together"),
 (["reproduce", "lifted", "--table", "1", "--duality"], "--table and --duality given together"),
]

FOLDERS = ("RUN", "EMPTY", "BADJSON", "BADCKPT", "ADMMRUN", "BADCFG", "OTHERARCH")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([*T, "--out", str(root / "RUN")]) == 0
        assert main([*A, "--out", str(root / "ADMMRUN")]) == 0
    (root / "EMPTY").mkdir()
    for name in ("BADJSON", "BADCKPT", "BADCFG", "OTHERARCH"):
        shutil.copytree(root / "RUN", root / name)
    (root / "OTHERARCH" / ".lock").unlink(missing_ok=True)
    cfg = json.loads((root / "OTHERARCH" / "config.json").read_text())
    (root / "OTHERARCH" / "config.json").write_text(json.dumps(cfg | {"arch": "64-8-10"}))
    (root / "BADJSON" / "config.json").write_text("{")
    (root / "BADCKPT" / "checkpoint.pt").write_bytes(b"xx")
    cfg = json.loads((root / "BADCFG" / "config.json").read_text())
    (root / "BADCFG" / "config.json").write_text(json.dumps(cfg | {"lr": -1}))
    return root


@pytest.mark.parametrize("args, fragment", CASES, ids=[f"{i}:{' '.join(c[0][-2:])}" for i, c in enumerate(CASES)])
def test_bad_input_gives_one_clear_line(folders, tmp_path, args, fragment):
    args = [str(folders / a) if a in FOLDERS else a for a in args]
    new_out = args[0] in ("train", "admm", "compare", "benchmark") and "--out" not in args and "--resume" not in args
    if new_out:
        args += ["--out", str(tmp_path / "out")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(args)
    except SystemExit as exc:   # argparse's own errors (wrong types, unknown choices)
        rc = exc.code
    text = err.getvalue()
    assert rc not in (0, None), f"accepted: {args}"
    assert "Traceback" not in text
    assert fragment in text, text
    assert text.strip().splitlines()[-1].startswith(("inferlearn: error:", "inferlearn ", "usage:")), text
    assert not (new_out and (tmp_path / "out").exists()), f"a refused run left {tmp_path / 'out'} behind"


def test_compare_into_another_run_changes_nothing(folders):
    """``compare --out`` a train run used to overwrite its curves.png and add its own files."""
    def files():   # the run's files (the lock file names its last holder's PID)
        return {p.name: p.stat().st_mtime_ns for p in (folders / "RUN").iterdir() if p.name != ".lock"}

    before = files()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main([*C, "--out", str(folders / "RUN")]) == 2
    assert files() == before


def test_table_size():
    """The issue asks for at least 120 kinds of bad input."""
    assert len(CASES) >= 120
