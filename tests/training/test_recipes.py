"""The CIFAR benchmarks' recipes: per-channel standardisation, crop-and-flip augmentation, AdamW and
weight decay, the cosine schedule with warm-up; each against an independent computation, and exact resume."""
import hashlib
import json
import math
import pickle

import numpy as np
import pytest
import torch

from inferlearn.cli import main
from inferlearn.data import datasets
from inferlearn.data.transforms import CropFlip, channel_stats
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import AUGMENT_STREAM, build, load_config, make_optimizer, train
from inferlearn.training.schedules import make_schedule

DROP = ("epoch_seconds", "compile_seconds")


def _strip(history):
    return [{k: v for k, v in r.items() if k not in DROP} for r in history]


def _crop_flip_oracle(x, shape, dy, dx, flip, fill, pad=4):
    """numpy: pad each channel with its fill value, cut the window, mirror it."""
    c, h, w = shape
    imgs = x.reshape(len(x), c, h, w)
    out = np.empty_like(imgs)
    for k in range(len(x)):
        padded = np.stack([np.pad(imgs[k, ch], pad, constant_values=fill[ch]) for ch in range(c)])
        window = padded[:, dy[k]:dy[k] + h, dx[k]:dx[k] + w]
        out[k] = window[:, :, ::-1] if flip[k] else window
    return out.reshape(len(x), -1)


def test_crop_flip_cuts_shifted_windows_of_the_padded_image_and_mirrors():
    shape, n = (3, 6, 7), 200
    x = torch.randn(n, 3 * 6 * 7, dtype=torch.float64)
    fill = torch.tensor([-1.5, 0.0, 2.0], dtype=torch.float64)
    aug = CropFlip(shape, seed=5, fill=fill)
    dy, dx, flip = aug.draw(n)
    assert set(dy.tolist()) == set(range(9)) and set(dx.tolist()) == set(range(9)), "offsets not uniform on 0..8"
    assert 0.35 < flip.double().mean() < 0.65
    out = aug.apply(x, dy, dx, flip)
    expected = _crop_flip_oracle(x.numpy(), shape, dy.numpy(), dx.numpy(), flip.numpy(), fill.numpy())
    np.testing.assert_array_equal(out.numpy(), expected)
    # centred windows: the flipped rows are torch.flip of the originals, the others unchanged
    centred = torch.full((n,), 4)
    out = aug.apply(x, centred, centred, flip).reshape(n, *shape)
    imgs = x.reshape(n, *shape)
    assert torch.equal(out[flip], torch.flip(imgs[flip], dims=[-1]))
    assert torch.equal(out[~flip], imgs[~flip])


def test_crop_flip_is_seeded():
    shape = (3, 8, 8)
    a, b, other = (CropFlip(shape, seed=s) for s in (1, 1, 2))
    for _ in range(3):   # successive batches
        da, db, do = a.draw(50), b.draw(50), other.draw(50)
        assert all(torch.equal(u, v) for u, v in zip(da, db))
        assert not all(torch.equal(u, v) for u, v in zip(da, do))
    state = a.state_dict()
    nxt = a.draw(50)
    a.load_state_dict(state)
    assert all(torch.equal(u, v) for u, v in zip(a.draw(50), nxt)), "the state does not restore the draws"


@pytest.fixture
def colour_folder(tmp_path, monkeypatch):
    """A generated CIFAR-10 python folder (the published checksums replaced by its own)."""
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.RandomState(0)
    sums = {}
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch", "batches.meta"]):
        # channels with different means, so a per-image or global statistic would not pass
        data = np.clip(rng.randint(0, 256, (8, 3, 1024)) * np.array([0.3, 0.6, 1.0])[None, :, None] + [[[0], [40], [10]]],
                       0, 255).astype(np.uint8).reshape(8, 3072)
        blob = pickle.dumps({b"labels": rng.randint(0, 10, 8).tolist(), b"data": data}, protocol=2)
        (folder / name).write_bytes(blob)
        sums[name] = hashlib.md5(blob).hexdigest()
    monkeypatch.setitem(datasets.SPECS, "cifar10", datasets.Spec(folder="cifar10", checksums=sums,
                                                                 archive=("cifar-10-python.tar.gz", "0" * 32)))
    datasets._load_cached.cache_clear()
    return tmp_path


def test_standardisation_uses_the_statistics_of_the_fitted_training_split(colour_folder, tmp_path):
    """μ_c, σ_c equal numpy's on exactly the images the run fits (not the held-out or test ones), and every
    split is mapped with them; ``auto`` standardises colour CIFAR-10."""
    cfg = TrainConfig(data="cifar10", arch="conv:4/8", data_dir=str(colour_folder), val_size=8, limit_train=25,
                      lr=0.1, out=str(tmp_path / "r"))
    assert cfg.resolved().standardize == "on"
    s = build(cfg)
    raw = datasets.load_dataset("cifar10", colour_folder)
    fit = raw.train_x[:25].numpy().astype(np.float64).reshape(25, 3, -1)
    mean, std = fit.mean(axis=(0, 2)), fit.std(axis=(0, 2))
    np.testing.assert_allclose(s.input_stats[0].numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(s.input_stats[1].numpy(), std, rtol=1e-12)
    for got, want in zip(channel_stats(raw.train_x[:25], (3, 32, 32), chunk=7), s.input_stats):   # chunked sums
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert not np.allclose(mean, raw.train_x[:32].numpy().reshape(32, 3, -1).mean(axis=(0, 2)))  # the split matters
    for got, x in ((s.train_x, raw.train_x[:25]), (s.val_x, raw.train_x[32:]), (s.test_x, raw.test_x)):
        ref = (x.numpy().astype(np.float64).reshape(len(x), 3, -1) - mean[:, None]) / std[:, None]
        np.testing.assert_allclose(got.numpy().reshape(len(x), 3, -1), ref, rtol=1e-5, atol=1e-6)
    assert s.augment is None
    assert build(cfg.replace(standardize="off")).input_stats is None


def test_auto_standardises_colour_sets_only_and_old_configs_keep_raw_pixels(tmp_path):
    assert [TrainConfig(data=d).resolved().standardize for d in ("cifar10", "cifar10-gray", "digits", "mnist")] == \
        ["on", "off", "off", "off"]
    train(TrainConfig(data="digits", arch="64-8-10", epochs=1, lr=0.1, out=str(tmp_path / "old")), progress=False, log=None)
    path = tmp_path / "old" / "config.json"
    d = json.loads(path.read_text())
    assert d["standardize"] == "off" and d["augment"] == "none" and d["weight_decay"] == 0.0
    for key in ("standardize", "augment", "weight_decay", "data"):
        d.pop(key)   # a config.json of an older version, on colour CIFAR-10
    path.write_text(json.dumps(d | {"data": "cifar10"}))
    old = load_config(tmp_path / "old")
    assert (old.standardize, old.augment, old.weight_decay) == ("off", "none", 0.0)
    assert old.resolved().standardize == "off"


def test_resume_is_exact_with_standardisation_and_augmentation(tmp_path):
    """1 + 2 resumed epochs equal 3 uninterrupted ones; the augmentation's generator state is what makes it so."""
    base = dict(data="digits", arch="conv:4/16", batch_size=64, optimizer="adamw", weight_decay=0.01, lr=0.01,
                seed=3, standardize="on", augment="crop-flip:force")
    full = train(TrainConfig(**base, epochs=3, out=str(tmp_path / "full")), progress=False, log=None)
    train(TrainConfig(**base, epochs=1, out=str(tmp_path / "part")), progress=False, log=None)
    resumed = train(TrainConfig(**base, epochs=3, out=str(tmp_path / "part")), progress=False, resume=True, log=None)
    assert _strip(resumed) == _strip(full)
    plain = train(TrainConfig(**(base | dict(augment="none")), epochs=3, out=str(tmp_path / "plain")), progress=False, log=None)
    assert _strip(plain) != _strip(full), "the augmentation changed nothing"
    # the generator restarted from its seed instead of its saved state: the resumed run differs
    train(TrainConfig(**base, epochs=1, out=str(tmp_path / "part2")), progress=False, log=None)
    ckpt_path = tmp_path / "part2" / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt.pop("payload_sha256")   # loads unverified, with a note
    ckpt["augment"] = CropFlip((1, 8, 8), seed=3 * 100_003 + AUGMENT_STREAM).state_dict()
    torch.save(ckpt, ckpt_path)
    other = train(TrainConfig(**base, epochs=3, out=str(tmp_path / "part2")), progress=False, resume=True, log=None)
    assert _strip(other)[1:] != _strip(full)[1:]


def test_cosine_schedule_matches_its_closed_form():
    """η_e = η (e+1)/W for e < W, then η ½(1 + cos(π (e − W)/(T − W))), stepped once per epoch."""
    lr, T, W = 0.3, 12, 3
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make_schedule(f"cosine:{W}", opt, T)
    got = []
    for _ in range(T):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [lr * (e + 1) / W for e in range(W)] + [lr * 0.5 * (1 + math.cos(math.pi * k / (T - W))) for k in range(T - W)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got[W - 1] == got[W] == pytest.approx(lr) and 0 < got[-1] < got[-2]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make_schedule("cosine", opt, 4)   # no warm-up
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(seen, [lr, lr * (1 + 2 ** -0.5) / 2, lr / 2, lr * (1 - 2 ** -0.5) / 2], rtol=1e-12)


def _optax_warmup_cosine(count, init, peak, warmup_steps, decay_steps, end):
    """optax.warmup_cosine_decay_schedule (exponent 1), transcribed from optax's definition: a linear schedule from
    ``init`` to ``peak`` over ``warmup_steps``, then ``cosine_decay_schedule(peak, decay_steps − warmup_steps,
    alpha=end/peak)`` at ``count − warmup_steps``."""
    if count < warmup_steps:
        return init + (peak - init) * count / warmup_steps
    d = decay_steps - warmup_steps
    t = min(count - warmup_steps, d)
    alpha = end / peak
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * t / d)) + alpha)


def test_warmup_cosine_schedule_is_pcx_per_step_schedule():
    """PCX's recipe: init lr, peak 1.1 lr after 10 % of the steps, cosine to 0.1 lr at the last, stepped per step."""
    lr, epochs, per_epoch = 2.6e-4, 5, 37
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make_schedule("warmup-cosine", opt, epochs, per_epoch)
    got = []
    for _ in range(epochs * per_epoch):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    total = epochs * per_epoch
    expected = [_optax_warmup_cosine(c, lr, 1.1 * lr, 0.1 * total, total, 0.1 * lr) for c in range(total)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert max(got) == pytest.approx(1.1 * lr, rel=1e-3) and got[0] == lr
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_schedule("warmup-cosine:2:0.5:0.25", opt, 1, 4)   # 2 warm-up steps: 1, 1.5, then 2 → 0.25
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(seen, [1.0, 1.5, 2.0, 0.25 + 1.75 * 0.5], rtol=1e-12)


def test_warmup_cosine_steps_per_batch_in_training_and_resumes_exactly(tmp_path, monkeypatch):
    """In a real run the rate moves every batch (the optimiser's rate after the run is the closed form at the
    step count), and a run interrupted after epoch 1 of 2 resumes to the uninterrupted run's metrics."""
    import inferlearn.training.loop as loop

    base = dict(data="digits", arch="conv:4/16", batch_size=128, optimizer="adamw", weight_decay=1e-5, lr=3e-3,
                seed=1, lr_schedule="warmup-cosine", epochs=2)
    full = train(TrainConfig(**base, out=str(tmp_path / "full")), progress=False, log=None)
    ckpt = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)
    steps = ckpt["scheduler"]["last_epoch"]
    assert steps > 2 and steps % 2 == 0, "the schedule stepped once per epoch, not once per batch"
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
        3e-3 * _optax_warmup_cosine(steps, 1, 1.1, 0.1 * steps, steps, 0.1), rel=1e-9)   # the floor, 0.1 lr
    real = loop.run_epoch

    def interrupted(s, config, epoch, *a, **k):
        if epoch == 2:
            raise KeyboardInterrupt
        return real(s, config, epoch, *a, **k)

    monkeypatch.setattr(loop, "run_epoch", interrupted)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        train(TrainConfig(**base, out=str(tmp_path / "part")), progress=False, log=None)
    monkeypatch.setattr(loop, "run_epoch", real)
    resumed = train(TrainConfig(**base, out=str(tmp_path / "part")), progress=False, resume=True, log=None)
    assert _strip(resumed) == _strip(full)


@pytest.mark.parametrize("bad, msg", [(dict(lr_schedule="cosine:x"), "use cosine:W"),
                                      (dict(lr_schedule="cosine:10", epochs=10), "leave none of the 10 epochs"),
                                      (dict(lr_schedule="warmup-cosine:1.1:1:0.1"), "use warmup-cosine:P:W:F"),
                                      (dict(lr_schedule="warmup-cosine:1.1:0.1"), "use warmup-cosine:P:W:F"),
                                      (dict(weight_decay=-1.0), "Invalid weight_decay"),
                                      (dict(standardize="yes"), "Unknown standardize"),
                                      (dict(augment="flip"), "Unknown augment")])
def test_bad_recipe_settings_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        TrainConfig(**bad)


def test_weight_decay_coupled_for_sgd_and_adam_decoupled_for_adamw():
    """With a zero loss gradient: SGD and AdamW shrink w by lr·λ·w (the decay alone), while Adam normalises
    the L2 gradient λw into a step of lr·sign(w) (|λw| ≫ ε)."""
    lr, wd = 0.1, 0.5
    w0 = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    for opt_name, expected in (("sgd", w0 * (1 - lr * wd)), ("adamw", w0 * (1 - lr * wd)),
                               ("adam", w0 - lr * torch.sign(w0))):
        p = torch.nn.Parameter(w0.clone())
        p.grad = torch.zeros_like(p)
        opt = make_optimizer(TrainConfig(optimizer=opt_name, lr=lr, weight_decay=wd), [p])
        opt.step()
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)
    assert TrainConfig(optimizer="adamw", rule="backprop").resolved().lr == TrainConfig(optimizer="adam").resolved().lr


def test_cli_records_the_recipe_in_config_json(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--data", "digits", "--arch", "conv:4/8", "--epochs", "2", "--lr", "0.01", "--optimizer", "adamw",
                 "--weight-decay", "5e-4", "--lr-schedule", "cosine:1", "--standardize", "on", "--augment", "crop-flip:force",
                 "--quiet", "--out", out]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert {k: saved[k] for k in ("optimizer", "weight_decay", "lr_schedule", "standardize", "augment")} == \
        dict(optimizer="adamw", weight_decay=5e-4, lr_schedule="cosine:1", standardize="on", augment="crop-flip:force")
    capsys.readouterr()
    assert main(["train", "--data", "digits", "--weight-decay", "-1", "--quiet", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Invalid weight_decay: -1.0" in err[0] and "Traceback" not in err[0]


def test_compare_takes_the_recipe_through_the_shared_config(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--data", "digits", "--arch", "conv:2-4/8", "--epochs", "1", "--limit-train", "200",
                 "--rules", "backprop", "--lr", "0.01", "--standardize", "on", "--augment", "crop-flip:force", "--optimizer", "adamw",
                 "--weight-decay", "1e-3", "--lr-schedule", "cosine", "--quiet", "--out", str(out)]) == 0
    saved = json.loads((out / "backprop" / "config.json").read_text())
    assert (saved["standardize"], saved["augment"], saved["optimizer"], saved["weight_decay"], saved["lr_schedule"]) == \
        ("on", "crop-flip:force", "adamw", 1e-3, "cosine")
    made, _, table = (out / "comparison.md").read_text().splitlines()[:3]
    assert made.startswith("Made by `inferlearn compare --data digits") and "--weight-decay 1e-3" in made
    assert table.endswith("adamw lr 0.01, batch 50, seed 0, epochs 1, first 200 training samples, weight decay 0.001, "
                          "lr schedule cosine, inputs standardised per channel, crop-flip:force augmentation.")
