"""End-to-end CLI runs on the offline digits data (and MNIST when present)."""
import json

from inferlearn.cli import main


def test_compare_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--data", "digits", "--arch", "64-16-10", "--epochs", "2", "--rules",
                 "backprop,fenchel-bp", "--out", str(out), "--quiet"]) == 0
    table = (out / "comparison.md").read_text()
    assert "| backprop |" in table and "| fenchel-bp |" in table
    assert (out / "curves.png").stat().st_size > 1000
    rows = json.loads((out / "comparison.json").read_text())["rules"]
    assert rows[0]["rule"] == "backprop" and abs(rows[0]["time_ratio"] - 1) < 1e-12
    assert "| backprop |" in capsys.readouterr().out


def test_data_list(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and "cifar10-gray" in out


def test_train_mnist_from_offline_files(mnist_dir, tmp_path):
    """The done-criterion command, shortened to 2000 samples: runs from the offline MNIST files."""
    assert main(["train", "--data", "mnist", "--arch", "784-64-64-64-10", "--act", "relu", "--rule", "backprop",
                 "--epochs", "1", "--limit-train", "2000", "--data-dir", mnist_dir, "--out", str(tmp_path / "m"),
                 "--quiet"]) == 0
    rec = json.loads((tmp_path / "m" / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["test_acc"] > 0.5
