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


def test_train_and_compare_take_a_conv_net(tmp_path):
    """`--arch conv:…` builds an affine-pooled conv net that every rule, the lifted ones included, trains."""
    out = tmp_path / "conv"
    assert main(["compare", "--data", "digits", "--arch", "conv:2-4/8", "--epochs", "1", "--limit-train", "200",
                 "--rules", "backprop,contrastive,pc", "--out", str(out), "--quiet"]) == 0
    rows = json.loads((out / "comparison.json").read_text())["rules"]
    assert [r["rule"] for r in rows] == ["backprop", "contrastive", "pc"]
    assert all(r["test_acc"] > 0.0 for r in rows)


def test_train_takes_a_users_model_builder(tmp_path, monkeypatch, capsys):
    """`--arch package.module:function` trains the user's own nn.Module; a missing builder is one clear line."""
    (tmp_path / "my_models.py").write_text(
        "from torch import nn\n\ndef build():\n"
        "    return nn.Sequential(nn.Linear(64, 12), nn.Hardtanh(0, 1), nn.Linear(12, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", "--data", "digits", "--arch", "my_models:build", "--rule", "eqprop", "--epochs", "1",
                 "--limit-train", "200", "--out", str(out), "--quiet"]) == 0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["epoch"] == 1 and 0.0 <= rec["test_acc"] <= 1.0
    assert main(["train", "--data", "digits", "--arch", "my_models:nope", "--epochs", "1", "--out",
                 str(tmp_path / "x"), "--quiet"]) != 0
    assert "Cannot load model builder 'my_models:nope'" in capsys.readouterr().err


def test_compare_overwrite_retrains_with_fewer_epochs(tmp_path, capsys):
    """`demo.sh --epochs 5` after a longer run must train 5 epochs, not print the old table: compare
    --overwrite starts afresh, and resuming with fewer epochs than done is refused clearly."""
    out = str(tmp_path / "cmp")
    base = ["compare", "--data", "digits", "--arch", "64-8-10", "--rules", "backprop", "--limit-train", "100",
            "--out", out, "--quiet"]
    assert main([*base, "--epochs", "2"]) == 0
    assert main([*base, "--epochs", "1"]) == 2
    assert "already holds 2 epochs" in capsys.readouterr().err
    assert main([*base, "--epochs", "1", "--overwrite"]) == 0
    rows = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["rules"]
    assert rows[0]["epochs"] == 1


def test_tensorboard_logs_scalars_histograms_and_filters(tmp_path):
    """--tensorboard writes event files holding the epoch's scalars, parameter histograms and the first
    layer's filters (read back with TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    assert main(["train", "--data", "digits", "--arch", "conv:2-4/8", "--epochs", "2", "--limit-train", "100",
                 "--out", str(tmp_path / "run"), "--tensorboard", str(tb), "--quiet"]) == 0
    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "histograms": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"train_loss", "test_acc", "epoch_seconds"} <= set(tags["scalars"])
    assert [e.step for e in acc.Scalars("test_acc")] == [1, 2]
    assert any(t.startswith("params/") and t.endswith("weight") for t in tags["histograms"])
    assert "first_layer_filters" in tags["images"]


def test_compare_tensorboard_gets_one_folder_per_rule(tmp_path):
    assert main(["compare", "--data", "digits", "--arch", "64-8-10", "--rules", "backprop,pc", "--epochs", "1",
                 "--limit-train", "100", "--out", str(tmp_path / "c"), "--tensorboard", str(tmp_path / "tb"),
                 "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["backprop", "pc"]


def test_threads_default_to_one_and_are_recorded(tmp_path):
    """The default thread count is 1 (PyTorch's default collapses beside a busy core), --threads N
    overrides it, and config.json records what the run used."""
    import torch
    before = torch.get_num_threads()
    try:
        out = tmp_path / "t"
        assert main(["train", "--data", "digits", "--arch", "64-8-10", "--epochs", "1", "--limit-train", "50",
                     "--out", str(out), "--quiet"]) == 0
        assert json.loads((out / "config.json").read_text())["threads"] == 1
        assert main(["train", "--data", "digits", "--arch", "64-8-10", "--epochs", "1", "--limit-train", "50",
                     "--out", str(tmp_path / "t2"), "--threads", "2", "--quiet"]) == 0
        assert json.loads((tmp_path / "t2" / "config.json").read_text())["threads"] == 2
        assert main(["train", "--resume", str(out), "--epochs", "2", "--threads", "2", "--quiet"]) == 0
        assert main(["train", "--data", "digits", "--threads", "0", "--out", str(tmp_path / "t3"), "--quiet"]) == 2
    finally:
        torch.set_num_threads(before)
