"""Block-parallel block-ADMM (one contiguous run of blocks per process, gloo on loopback).

Oracle: the one-process trainer with the same Jacobi schedule, from the same start — weights, Z, U,
residuals, penalties (adaptive too) and predictions after 3 outer iterations, with 2 and 3 processes;
a gathered checkpoint resumes identically; the CLI's ``--nproc 2`` run, resumed with one process,
equals an uninterrupted one-process run. The Jacobi schedule itself is checked against a hand-written
simultaneous update.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.admm.parallel import block_owners, check_block_parallel
from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.distributed.launch import free_port

HERE = Path(__file__).resolve().parents[1]   # the shared helpers and workers
CLI = [sys.executable, "-m", "inferlearn"]
ADMM = ["admm", "--data", "digits", "--arch", "64-32-32-10", "--batch-size", "64", "--quiet"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


@pytest.mark.parametrize("nproc,variant", [(2, "plain"), (3, "plain"), (2, "adaptive")])
def test_block_parallel_equals_one_process_jacobi(tmp_path, nproc, variant):
    out = tmp_path / "errors.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--rdzv-backend",
                    "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(HERE / "admm_parallel_worker.py"),
                    str(out), variant], env=_env(), check=True, capture_output=True, timeout=240)
    errors = json.loads(out.read_text())
    assert len(errors) == 19
    assert max(errors.values()) < 1e-10, errors


def test_jacobi_updates_every_z_from_the_previous_values():
    torch.manual_seed(0)
    X, Y = torch.randn(20, 6, dtype=torch.float64), torch.randint(0, 3, (20,))
    cfg = ADMMConfig(z_schedule="jacobi", zeta=0.3, beta=[1.5, 0.7])
    trainer = BlockADMM(split_sequential(mlp("6-5-4-3", seed=0, dtype=torch.float64)), cfg)
    trainer.init_state(X, Y)
    for z in trainer.Z:
        z.add_(0.1 * torch.randn_like(z))   # off the forward pass, so every term matters
    f1, f2, f3 = trainer.blocks
    Z1, Z2, U1, U2 = (v.clone() for v in (*trainer.Z, *trainer.U))

    def z_new(z, target, beta, next_term):
        z = z.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(0.5 * beta * (z - target).pow(2).sum() + next_term(z), z)
        return (z - 0.3 * g).detach()

    with torch.no_grad():
        t1, t2 = f1(X) - U1, f2(Z1) - U2
    want1 = z_new(Z1, t1, 1.5, lambda z: 0.5 * 0.7 * (Z2 - f2(z) + U2).pow(2).sum())
    want2 = z_new(Z2, t2, 0.7, lambda z: torch.nn.functional.cross_entropy(f3(z), Y, reduction="sum"))
    trainer._jacobi_z_update()
    torch.testing.assert_close(trainer.Z[0], want1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(trainer.Z[1], want2, rtol=1e-12, atol=1e-12)


def test_owners_and_refusals():
    assert block_owners(3, 2) == [0, 0, 1] and block_owners(3, 3) == [0, 1, 2] and block_owners(5, 2) == [0, 0, 0, 1, 1]
    # balanced by cost: the wide first block alone on rank 0
    assert block_owners(3, 2, [200_000, 65_000, 2_500]) == [0, 1, 1]
    assert block_owners(4, 2, [1, 1, 1, 10]) == [0, 0, 0, 1]
    blocks = split_sequential(mlp("6-5-4-3", seed=0))
    with pytest.raises(ValueError, match="more than the 3 blocks"):
        check_block_parallel(ADMMConfig(z_schedule="jacobi"), blocks, 4)
    with pytest.raises(ValueError, match="batch mode"):
        check_block_parallel(ADMMConfig(mode="online", z_schedule="jacobi"), blocks, 2)
    with pytest.raises(ValueError, match="z-steps 1"):
        check_block_parallel(ADMMConfig(z_steps=2, z_schedule="jacobi"), blocks, 2)
    with pytest.raises(ValueError, match="formulation paper"):
        check_block_parallel(ADMMConfig(formulation="paper", z_schedule="jacobi"), blocks, 2)
    with pytest.raises(ValueError, match="z-schedule jacobi"):
        check_block_parallel(ADMMConfig(), blocks, 2)


def test_cli_nproc_2_then_resumed_with_one_process_equals_one_process(tmp_path):
    run, ref = tmp_path / "run", tmp_path / "ref"
    r = subprocess.run(CLI + ADMM + ["--epochs", "2", "--out", str(run), "--nproc", "2"], env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "config.json").read_text())["nproc"] == 2
    r = subprocess.run(CLI + ["admm", "--resume", str(run), "--epochs", "3", "--quiet"], env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    subprocess.run(CLI + ADMM + ["--epochs", "3", "--out", str(ref), "--z-schedule", "jacobi"], env=_env(), check=True,
                   capture_output=True, timeout=240)
    got = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        for key in ("train_loss", "test_loss", "test_acc", "residual_1", "residual_2", "admm_objective"):
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), (g["epoch"], key)


def test_cli_refuses_more_processes_than_blocks_in_one_line(tmp_path):
    r = subprocess.run(CLI + ADMM + ["--epochs", "1", "--out", str(tmp_path / "x"), "--nproc", "4"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "at most 3 processes" in r.stderr
