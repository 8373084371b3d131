"""``--resume --nproc 2``: every process of a launched run reads the run folder, rank 0 alone probes and
cleans it (several probes at once made each other fail about 4 times in 10, "Cannot write to output
folder … No such file or directory"); and a resumed block-parallel ADMM run writes the checkpoint of an
uninterrupted one (the optimiser state of each block comes from the process that owns the block).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CLI = [sys.executable, "-m", "inferlearn"]
TRAIN = ["train", "--data", "digits", "--arch", "64-32-32-10", "--rule", "contrastive", "--batch-size", "50",
         "--limit-train", "600", "--quiet"]
ADMM = ["admm", "--data", "digits", "--arch", "64-32-32-10", "--batch-size", "64", "--limit-train", "600", "--quiet"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _cli(args, timeout=240):
    return subprocess.run(CLI + args, env=_env(), capture_output=True, text=True, timeout=timeout)


def _resume_repeatedly(base: list[str], run: Path, times: int) -> int:
    """Start a ``--nproc 2`` run, then ``--resume`` it ``times`` times with ``--nproc 2``: the successes."""
    r = _cli(base + ["--epochs", "2", "--out", str(run), "--nproc", "2"])
    assert r.returncode == 0, r.stderr
    ok = 0
    for i in range(times):
        r = _cli([base[0], "--resume", str(run), "--nproc", "2", "--quiet"])
        assert r.returncode == 0, f"resume {i + 1} of {times} failed: {r.stderr}"
        assert "Traceback" not in r.stderr
        ok += 1
    assert not list(run.glob(".write-test*")) and not list(run.glob(".*.tmp"))
    return ok


@pytest.mark.parametrize("base,times", [(TRAIN, 3), (ADMM, 2)], ids=["train", "admm"])
def test_resume_with_two_processes_succeeds_every_time(tmp_path, base, times):
    assert _resume_repeatedly(base, tmp_path / "run", times) == times


@pytest.mark.slow
@pytest.mark.parametrize("base", [TRAIN, ADMM], ids=["train", "admm"])
def test_resume_with_two_processes_20_times(tmp_path, base):
    assert _resume_repeatedly(base, tmp_path / "run", 20) == 20
