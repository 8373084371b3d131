"""Block-ADMM run folders: exact resume, memory-mapped state, divergence and bad-input errors."""
import json

import pytest
import torch
from torch import nn

from inferlearn.admm import ADMMConfig, BlockADMM, RunData, random_shift, train_admm
from inferlearn.atomic import read_jsonl
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.errors import DivergenceError

torch.set_num_threads(1)


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(96, 16, generator=g)
    y = (X[:, :8].sum(1) > X[:, 8:].sum(1)).long() + 2 * (X[:, 0] > 0.5).long()
    return RunData(X[:64], y[:64], X[64:], y[64:])


def _trainer(mode="batch", memmap_dir=None, **kw):
    blocks = split_sequential(mlp("16-12-12-4", act="tanh", seed=0))
    cfg = ADMMConfig(mode=mode, batch_size=16, lr=0.01, beta=1.0, zeta=0.3, seed=5, **kw)
    return BlockADMM(blocks, cfg, memmap_dir=memmap_dir)


def _params(tr):
    return torch.cat([p.detach().flatten() for b in tr.blocks for p in b.parameters()])


@pytest.mark.parametrize("mode, kw", [("batch", {}), ("batch", {"adaptive": True, "eta0": 0.05, "primal_growth": 0.5}),
                                      ("online", {"z_steps": 2}), ("online", {"adaptive": True, "eta0": 1e-3})])
def test_resume_continues_exactly(tmp_path, mode, kw):
    """4 epochs straight and 2 + resume 2 must give bit-identical weights, Z, U, duals, penalties and
    metrics. Guards against checkpoints that miss optimiser moments, duals, the penalty state, the
    RNG of the mini-batch order or the online augmentation."""
    data = _data()
    if mode == "online":
        data.transform = random_shift(1, (1, 4, 4))
    ref = _trainer(mode, **kw)
    h_ref = train_admm(ref, data, 4, out=tmp_path / "a", progress=False)
    first = _trainer(mode, **kw)
    train_admm(first, data, 2, out=tmp_path / "b", progress=False)
    second = _trainer(mode, **kw)
    h = train_admm(second, data, 4, out=tmp_path / "b", resume=True, progress=False)
    assert torch.equal(_params(ref), _params(second))
    for a, b in zip(ref.Z + ref.U, second.Z + second.U):
        assert torch.equal(a, b)
    assert ref.beta == second.beta and ref.lam == second.lam
    lines = [json.loads(s) for s in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2, 3, 4]
    drop = {"epoch_seconds", "theta_seconds", "z_dual_seconds"}
    assert [{k: v for k, v in m.items() if k not in drop} for m in h] == \
           [{k: v for k, v in m.items() if k not in drop} for m in h_ref]
    assert json.loads((tmp_path / "b" / "config.json").read_text())["admm"]["mode"] == mode


def test_memmap_state_matches_in_memory(tmp_path):
    """Z and U memory-mapped on disk must give the same training as in RAM, and the memory report must
    say where the state lives. Guards against writes to a copy instead of the mapped file."""
    data = _data()
    a, b = _trainer(), _trainer(memmap_dir=tmp_path / "mm")
    train_admm(a, data, 2, progress=False)
    train_admm(b, data, 2, progress=False)
    assert torch.equal(_params(a), _params(b))
    assert b.memory_bytes() == {"state_bytes": 4 * 64 * 12 * 4, "state_on_disk": True}
    assert sorted(p.name for p in (tmp_path / "mm").iterdir()) == ["U1.f32", "U2.f32", "Z1.f32", "Z2.f32"]
    on_disk = torch.from_numpy(__import__("numpy").fromfile(tmp_path / "mm" / "Z2.f32", dtype="float32"))
    assert torch.equal(on_disk.reshape(64, 12), b.Z[1])


def test_divergence_names_epoch_and_checkpoint(tmp_path):
    """A run that blows up must stop with DivergenceError naming the epoch and the last good
    checkpoint, not write NaN metrics."""
    data = _data()
    tr = _trainer()
    train_admm(tr, data, 1, out=tmp_path, progress=False)
    data.train_x[3, 5] = float("nan")  # a corrupt sample poisons the block losses in epoch 2
    with pytest.raises(DivergenceError, match=r"epoch 2.*last good checkpoint: .*checkpoint.pt \(epoch 1\)"):
        train_admm(_trainer(), data, 3, out=tmp_path, resume=True, progress=False)
    assert [m["epoch"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [1]


@pytest.mark.parametrize("kw, msg", [({"beta": float("nan")}, "Invalid beta: nan"), ({"beta": float("inf")}, "Invalid beta: inf"),
                                     ({"beta": -1.0}, "Invalid beta: -1.0"), ({"zeta": 0.0}, "Invalid zeta: 0.0"),
                                     ({"mode": "stream"}, "Unknown mode"), ({"z_steps": 0}, "Invalid z_steps: 0"),
                                     ({"penalty_growth": 1.0}, "Invalid penalty_growth")])
def test_bad_config(kw, msg):
    """Non-finite or non-positive penalties and other bad settings fail at construction."""
    with pytest.raises(ValueError, match=msg):
        ADMMConfig(**kw)


def test_penalty_list_must_match_blocks():
    """One penalty per constraint (T − 1 of them); guards against silently broadcasting a wrong list."""
    blocks = [nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2)]
    with pytest.raises(ValueError, match="Expected 2 values for beta"):
        BlockADMM(blocks, ADMMConfig(beta=[1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="Invalid beta: nan"):
        BlockADMM(blocks, ADMMConfig(beta=[1.0, float("nan")]))


def test_batch_mode_rejects_changing_data():
    """Batch mode keeps Z for fixed samples; passing new data each epoch must be refused."""
    tr = _trainer()
    data = _data()
    tr.init_state(data.train_x, data.train_y)
    with pytest.raises(ValueError, match="mode='online'"):
        tr.epoch(data.train_x, data.train_y)
