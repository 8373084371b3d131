"""``inferlearn admm`` end to end on the offline digits data: run, resume, NMF, bad input."""
import json

import pytest

from inferlearn.cli import main


def test_cli_runs_and_resumes(tmp_path, capsys):
    """The subcommand must write the run folder, and --resume must extend the run to more epochs
    with the saved settings (not the defaults). Guards against a CLI that ignores saved options."""
    out = tmp_path / "run"
    args = ["admm", "--data", "digits", "--arch", "64-32-32-10", "--epochs", "1", "--batch-size", "64",
            "--lr", "0.01", "--beta", "1,2", "--out", str(out), "--quiet"]
    assert main(args) == 0
    assert main(["admm", "--resume", str(out), "--epochs", "2", "--quiet"]) == 0
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2]
    assert lines[1]["beta_2"] == 2.0
    assert json.loads((out / "config.json").read_text())["run"]["arch"] == "64-32-32-10"
    assert "test accuracy" in capsys.readouterr().out


def test_cli_nmf_and_online(tmp_path):
    """DeepFacto (NMF between blocks) and online mode with shifts run from the command line."""
    assert main(["admm", "--data", "digits", "--arch", "64-32-10", "--epochs", "1", "--nmf-rank", "8",
                 "--beta", "10", "--zeta", "0.05", "--out", str(tmp_path / "n"), "--quiet"]) == 0
    assert main(["admm", "--data", "digits", "--arch", "64-32-10", "--epochs", "1", "--mode", "online",
                 "--shift", "1", "--z-steps", "2", "--out", str(tmp_path / "o"), "--quiet"]) == 0


@pytest.mark.parametrize("extra, msg", [(["--split", "9"], "Invalid split point 9"),
                                        (["--split", "abc"], "Invalid --split 'abc'"),
                                        (["--epochs", "0"], "Invalid --epochs 0"),
                                        (["--act", "softmax"], "Unknown activation 'softmax'"),
                                        (["--nmf-rank", "40"], "Invalid NMF rank 40"),
                                        (["--beta", "nan"], "Invalid beta: nan"),
                                        (["--shift", "2"], "needs --mode online"),
                                        (["--formulation", "paper", "--mode", "online"], "needs mode 'batch'"),
                                        (["--formulation", "paper", "--beta", "1,2,3"], "Expected 2 values for beta"),
                                        (["--primal-schedule", "proposition", "--primal-growth", "1"],
                                         "set one of them")])
def test_cli_bad_input(tmp_path, capsys, extra, msg):
    """Bad split points, NMF ranks, penalties and settings end with exit code 2 and a clear message."""
    assert main(["admm", "--data", "digits", "--arch", "64-32-10", "--epochs", "1", "--out", str(tmp_path),
                 "--quiet", *extra]) == 2
    assert msg in capsys.readouterr().err


def test_cli_paper_formulation_runs_and_resumes(tmp_path):
    """--formulation paper with Proposition 1's schedule runs (Z_T in the state, its residual logged, p_k
    passes) and resumes with its saved settings."""
    out = tmp_path / "p"
    assert main(["admm", "--data", "digits", "--arch", "64-32-10", "--epochs", "1", "--formulation", "paper",
                 "--primal-schedule", "proposition", "--eta-decay", "0.5", "--adaptive", "--out", str(out),
                 "--quiet"]) == 0
    assert main(["admm", "--resume", str(out), "--epochs", "2", "--quiet"]) == 0
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["primal_steps"] for m in lines] == [1, 4]
    assert "residual_2" in lines[1] and "beta_2" in lines[1]


def test_cli_run_folder_guards(tmp_path, capsys):
    """admm shares train's run folder: no silent overwrite, --resume of a train folder or of a missing
    folder is one clear line, and a folder without a checkpoint restarts with a note."""
    out = tmp_path / "a"
    base = ["admm", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--quiet"]
    assert main([*base, "--out", str(out)]) == 0
    assert (out / "curves.png").exists()
    assert main([*base, "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main([*base, "--out", str(out), "--overwrite"]) == 0
    assert main(["train", "--data", "digits", "--arch", "64-16-10", "--epochs", "1", "--out", str(tmp_path / "t"),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["admm", "--resume", str(tmp_path / "t"), "--quiet"]) == 2
    assert "not the config of an `inferlearn admm` run" in capsys.readouterr().err
    assert main(["admm", "--resume", str(tmp_path / "missing"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (out / "checkpoint.pt").unlink()
    assert main(["admm", "--resume", str(out), "--quiet"]) == 0
    assert "no checkpoint yet" in capsys.readouterr().out
