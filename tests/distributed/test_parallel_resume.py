"""Runs of several processes. ``--resume --nproc 2``: every process of a launched run reads the run folder, rank 0 alone probes and
cleans it (several probes at once made each other fail about 4 times in 10, "Cannot write to output
folder … No such file or directory"); and a resumed block-parallel ADMM run writes the checkpoint of an
uninterrupted one (the optimiser state of each block comes from the process that owns the block);
SIGTERM or SIGINT of a ``--nproc 2`` launcher ends the run with one line holding the resume command
(the elastic agent printed a 30-line traceback), and SIGINT of one process names the run folder.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
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


@pytest.mark.parametrize("base,times", [(TRAIN, 2), (ADMM, 1)], ids=["train", "admm"])
def test_resume_with_two_processes_succeeds_every_time(tmp_path, base, times):
    assert _resume_repeatedly(base, tmp_path / "run", times) == times


@pytest.mark.slow
@pytest.mark.parametrize("base", [TRAIN, ADMM], ids=["train", "admm"])
def test_resume_with_two_processes_20_times(tmp_path, base):
    assert _resume_repeatedly(base, tmp_path / "run", 20) == 20


def _state(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)["state"]


def test_admm_two_processes_resumed_checkpoint_equals_an_uninterrupted_one(tmp_path):
    """The per-process optimiser states were merged with ``dict.update``: after a resume every process holds
    the loaded copy of the others' blocks' Adam state, and a stale copy won (``step`` 600 instead of 1800)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from oracle_helpers import assert_same_tree

    run, ref = tmp_path / "run", tmp_path / "ref"
    for args in (ADMM + ["--epochs", "1", "--out", str(run), "--nproc", "2"],
                 ["admm", "--resume", str(run), "--epochs", "2", "--nproc", "2", "--quiet"],
                 ADMM + ["--epochs", "2", "--out", str(ref), "--nproc", "2"]):
        r = _cli(args)
        assert r.returncode == 0, r.stderr
    got, want = _state(run), _state(ref)
    steps = {int(s["step"]) for s in got["optimizer"]["state"].values()}
    assert steps == {2 * 10}, steps   # 600 samples / batch 64 = 10 Adam steps per epoch, every block
    assert assert_same_tree(got, want) > 10


def _rank_pid(tag: str, rank: int, deadline: float) -> int:
    """The pid of the launched process with ``RANK=rank`` in the run tagged ``tag``."""
    want = {f"INFERLEARN_SIGNAL_TEST={tag}".encode(), f"RANK={rank}".encode()}
    while time.time() < deadline:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    env = set((proc / "environ").read_bytes().split(b"\0"))
                except OSError:
                    continue
                if want <= env:
                    return int(proc.name)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} process found")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find a process")
@pytest.mark.parametrize("who,sig", [("launcher", signal.SIGTERM), ("launcher", signal.SIGINT), ("process 1", signal.SIGINT)])
def test_a_signal_ends_a_two_process_run_with_the_resume_command(tmp_path, who, sig):
    tag, run = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen(CLI + TRAIN + ["--epochs", "400", "--out", str(run), "--nproc", "2"],
                            env=dict(_env(), INFERLEARN_SIGNAL_TEST=tag), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not (run / "checkpoint.pt").exists():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.1)
    worker = _rank_pid(tag, 1, deadline)
    os.kill(proc.pid if who == "launcher" else worker, sig)
    _, err = proc.communicate(timeout=120)
    hint = f"`inferlearn train --resume {run}`"
    assert "Traceback" not in err and "SignalException" not in err, err
    if who == "launcher":
        assert proc.returncode == 128 + sig, err
        assert err.strip() == f"inferlearn: interrupted by {sig.name}; if the run had started, continue it with {hint} " \
                              "(any --nproc)", err
    else:   # the process's own line, then the launcher's (and rank 0's, if it noticed the lost peer first)
        assert proc.returncode == 2, err
        assert err.splitlines()[0] == f"inferlearn: process 1: interrupted; if the run had started, continue it with " \
                                      f"{hint} (any --nproc)", err
        assert "process 1 of 2 failed (exit code 130)" in err and hint in err.splitlines()[-1], err
    for _ in range(100):   # no process outlives the run
        if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a process outlived its launcher")
    if sig == signal.SIGTERM:
        done = len((run / "metrics.jsonl").read_text().splitlines())
        r = _cli(["train", "--resume", str(run), "--epochs", str(done + 1), "--quiet"])   # the lock went with the run
        assert r.returncode == 0, r.stderr
