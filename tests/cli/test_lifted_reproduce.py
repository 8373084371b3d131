"""``inferlearn reproduce lifted``: the table pipeline end to end (shortened), and its bad input."""
from __future__ import annotations

import pytest

from inferlearn.cli import main


def test_reproduce_table1_shortened(mnist_dir, tmp_path, capsys):
    """Guards against a table that silently drops rows, mislabels columns or skips pictures: all four
    rows trained from the same seed, a Markdown table with the exact command, curves and filters."""
    out = tmp_path / "r"
    assert main(["reproduce", "lifted", "--table", "1", "--epochs", "1", "--limit-train", "300", "--acts", "relu",
                 "--data-dir", mnist_dir, "--out", str(out)]) == 0
    md = (out / "table1" / "table1.md").read_text()
    for row in ("back-propagation", "contrastive (J_1)", "standard lifted (J_0)", "linear regression"):
        assert f"| {row} |" in md
    assert "relu train | relu test | relu active" in md and "1 epochs (paper: 100)" in md
    assert "inferlearn reproduce lifted --table 1 --epochs 1" in md
    assert (out / "table1" / "filters_relu.png").stat().st_size > 1000
    assert (out / "table1" / "curves_relu.png").stat().st_size > 1000
    assert "| back-propagation |" in capsys.readouterr().out


def test_reproduce_figure1_shortened(mnist_dir, tmp_path):
    """Guards against Fig. 1 drawing the wrong network or rules: the paper's 784-64-64-10 ReLU network
    trained by BP, contrastive and J_0 from the same seed, filters side by side, the exact command."""
    out = tmp_path / "f"
    assert main(["reproduce", "lifted", "--figure", "1", "--epochs", "1", "--limit-train", "200",
                 "--data-dir", mnist_dir, "--out", str(out)]) == 0
    md = (out / "figure1" / "figure1.md").read_text()
    assert "784-64-64-10 (relu)" in md
    assert "inferlearn reproduce lifted --figure 1 --epochs 1 --acts relu --rows backprop,contrastive,lifted-j0" in md
    for row in ("back-propagation", "contrastive (J_1)", "standard lifted (J_0)"):
        assert f"| {row} |" in md
    assert "linear regression" not in md
    assert (out / "figure1" / "filters_relu.png").stat().st_size > 1000
    cfg = (out / "figure1" / "relu" / "contrastive" / "config.json").read_text()
    assert '"784-64-64-10"' in cfg


def test_reproduce_alignment_gammas(tmp_path, capsys):
    """Guards against a bad --gammas or --alignment-rules value starting a run."""
    for argv, msg in ((["--gammas", "1,0"], "Invalid gamma '0'"), (["--gammas", "1/x"], "Invalid gamma '1/x'"),
                      (["--alignment-rules", "eqprop"], "Unknown rule 'eqprop'")):
        assert main(["reproduce", "lifted", "--alignment", *argv, "--out", str(tmp_path / "a")]) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--table", "5"], "invalid choice"),
    (["--table", "1", "--gamma", "0"], "Invalid gamma '0' in --gamma"),
    (["--table", "1", "--gamma", "1/0"], "Invalid gamma '1/0' in --gamma"),
    (["--duality", "--gamma=-1/8"], "Invalid gamma '-1/8' in --gamma"),
    (["--table", "1", "--rows", "magic"], "Unknown row 'magic'"),
    (["--table", "1", "--acts", "softplus"], "Unknown unit type 'softplus'"),
])
def test_reproduce_bad_input(argv, msg, tmp_path, capsys):
    """Guards against invalid settings starting a long run or failing with a traceback."""
    with pytest.raises(SystemExit) if "invalid choice" in msg else _nullcontext():
        rc = main(["reproduce", "lifted", *argv, "--epochs", "1", "--out", str(tmp_path / "x")])
        assert rc == 2
    assert msg in capsys.readouterr().err


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("what", [["--figure", "1"], ["--table", "1", "--acts", "relu", "--rows", "contrastive"]])
def test_reproduce_dtype_reaches_every_run(what, mnist_dir, tmp_path):
    """Guards against --dtype float64 being ignored by a reproduction: every run's config and weights are
    float64, and the written command carries the option."""
    import json

    import torch

    out = tmp_path / "d"
    assert main(["reproduce", "lifted", *what, "--epochs", "1", "--limit-train", "100", "--dtype", "float64",
                 "--data-dir", mnist_dir, "--out", str(out)]) == 0
    configs = list(out.rglob("config.json"))
    assert configs and all(json.loads(c.read_text())["dtype"] == "float64" for c in configs)
    for c in configs:
        ckpt = torch.load(c.parent / "checkpoint.pt", weights_only=False)
        assert all(v.dtype == torch.float64 for v in ckpt["model"].values() if v.is_floating_point())
    assert "--dtype float64" in next(out.rglob("*.md")).read_text()
