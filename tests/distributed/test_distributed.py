"""Data-parallel training on torch.distributed (gloo, loopback only).

Oracles: the gradient averaged over 2 ranks' shards equals the 1-process full-batch gradient for
every rule (float64, MLP, conv net and a residual conv net); ``train --nproc 2`` gives the metrics of ``--nproc 1``; a
killed rank ends the run with one line, and the run resumes with another number of processes to the
metrics of an uninterrupted run; a hung rank makes the others fail within ``--dist-timeout``.
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from inferlearn.distributed import Group, strip_nproc
from inferlearn.distributed.launch import free_port

HERE = Path(__file__).resolve().parents[1]   # the shared helpers and workers
CLI = [sys.executable, "-m", "inferlearn"]
TRAIN = ["train", "--data", "digits", "--arch", "64-32-32-10", "--rule", "contrastive", "--batch-size", "100",
         "--quiet"]


def _env(tag: str = "") -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", INFERLEARN_DP_TEST=tag)
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _same_metrics(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "batch_loss", "train_acc", "test_acc", "active_fraction"):
            assert ra[key] == pytest.approx(rb[key], rel=rel, abs=1e-7), (ra["epoch"], key)


def test_shards_and_ranges_cover_every_row_once():
    import torch

    rows = torch.arange(11)
    parts = [Group(rank=r, world=3).shard(rows) for r in range(3)]
    assert torch.equal(torch.cat(parts), rows) and [len(p) for p in parts] == [4, 4, 3]
    ranges = [Group(rank=r, world=3).shard_range(11) for r in range(3)]
    assert ranges == [(0, 4), (4, 8), (8, 11)]
    assert strip_nproc(["train", "--nproc", "2", "--epochs", "3", "--nproc=4"]) == ["train", "--epochs", "3"]


@pytest.mark.parametrize("command", ["train", "admm"])
@pytest.mark.parametrize("nproc", ["0", "-2"])
def test_a_bad_nproc_is_one_line(tmp_path, command, nproc):
    r = subprocess.run(CLI + [command, "--data", "digits", "--nproc", nproc, "--out", str(tmp_path / "x")], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"inferlearn: error: Invalid --nproc {nproc}: must be an integer ≥ 1"


def test_sharded_gradients_equal_the_full_batch_gradient_for_every_rule(tmp_path):
    out = tmp_path / "errors.json"
    port = free_port()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{port}", str(HERE / "distributed_worker.py"), str(out)],
                   env=_env(), check=True, capture_output=True, timeout=240)
    errors = json.loads(out.read_text())
    assert len(errors) >= 21   # every rule × {MLP, conv, residual conv}
    assert max(errors.values()) < 1e-9, errors


@pytest.mark.parametrize("recipe", [[], ["--augment", "crop-flip:force"]], ids=["plain", "crop-flip"])
def test_train_with_two_processes_matches_one(tmp_path, recipe):
    """With augmentation every process draws the crops and flips of the whole global batch and applies its rows'."""
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run(CLI + TRAIN + recipe + ["--epochs", "2", "--out", str(one)], env=_env(), check=True, capture_output=True,
                   timeout=240)
    r = subprocess.run(CLI + TRAIN + recipe + ["--epochs", "2", "--out", str(two), "--nproc", "2"], env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("epoch   1") == 1   # only rank 0 speaks
    _same_metrics(_metrics(one), _metrics(two))
    assert json.loads((two / "config.json").read_text())["nproc"] == 2


def test_mac_shares_its_per_sample_coordinates_across_processes(tmp_path):
    """MAC keeps auxiliary coordinates per training sample; with 2 processes every process must hold
    every sample's, or the second epoch's warm starts would differ from one process's."""
    one, two = tmp_path / "one", tmp_path / "two"
    mac = TRAIN[:TRAIN.index("contrastive")] + ["mac"] + TRAIN[TRAIN.index("contrastive") + 1:]
    mac += ["--limit-train", "600"]   # MAC takes a fixed number of Z steps: equal to rounding
    subprocess.run(CLI + mac + ["--epochs", "3", "--out", str(one)], env=_env(), check=True, capture_output=True,
                   timeout=240)
    r = subprocess.run(CLI + mac + ["--epochs", "3", "--out", str(two), "--nproc", "2"], env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    _same_metrics(_metrics(one), _metrics(two), rel=1e-4)


def _rank_pid(tag: str, rank: int, deadline: float) -> int:
    """The pid of the launched process with ``RANK=rank`` in the run tagged ``tag``."""
    want = {f"INFERLEARN_DP_TEST={tag}".encode(), f"RANK={rank}".encode()}
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


def _wait_for_epochs(folder: Path, n: int, deadline: float) -> None:
    while time.time() < deadline:
        if (folder / "metrics.jsonl").exists() and len(_metrics(folder)) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{folder} never reached {n} epochs")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find a rank")
def test_a_killed_rank_ends_the_run_and_it_resumes_with_another_nproc(tmp_path):
    tag, run, ref = uuid.uuid4().hex, tmp_path / "run", tmp_path / "ref"
    epochs = 20
    # back-propagation: 2 and 1 processes differ by rounding only (an iterative rule's shards stop at their
    # own tolerance, which over 20 epochs may flip a training sample)
    train = TRAIN[:TRAIN.index("contrastive")] + ["backprop"] + TRAIN[TRAIN.index("contrastive") + 1:]
    proc = subprocess.Popen(CLI + train + ["--epochs", str(epochs), "--out", str(run), "--nproc", "2"],
                            env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    _wait_for_epochs(run, 2, deadline)
    os.kill(_rank_pid(tag, 1, deadline), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    # rank 0 may notice the lost peer before the launcher does: both are reported, the killed one by its signal
    assert "process 1 of 2 was killed by signal 9" in err and "--resume" in err and "Traceback" not in err
    done = len(_metrics(run))
    assert 2 <= done < epochs
    r = subprocess.run(CLI + ["train", "--resume", str(run), "--quiet"], env=_env(), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    subprocess.run(CLI + train + ["--epochs", str(epochs), "--out", str(ref)], env=_env(), check=True,
                   capture_output=True, timeout=240)
    _same_metrics(_metrics(run), _metrics(ref), rel=1e-4)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find a rank")
def test_killing_the_launcher_kills_its_workers(tmp_path):
    """The elastic launcher starts workers in sessions of their own: without PR_SET_PDEATHSIG they
    would train on, and write the run folder, after ``kill -9`` of the launcher."""
    tag, run = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen(CLI + TRAIN + ["--epochs", "400", "--out", str(run), "--nproc", "2"], env=_env(tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    _wait_for_epochs(run, 1, deadline)
    worker = _rank_pid(tag, 0, deadline)
    proc.kill()
    proc.wait(timeout=30)
    for _ in range(100):
        if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a worker outlived its launcher")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find a rank")
def test_a_hung_rank_makes_the_others_fail_within_the_timeout(tmp_path):
    tag, run = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen(CLI + TRAIN + ["--epochs", "400", "--out", str(run), "--nproc", "2", "--dist-timeout", "3"],
                            env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    _wait_for_epochs(run, 1, deadline)
    pid = _rank_pid(tag, 1, deadline)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.time()
    try:
        _, err = proc.communicate(timeout=90)   # the timeout, then the launcher's 30 s grace for a stopped process
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 2
    assert "did not answer within 3 s" in err and "Traceback" not in err
    assert time.time() - t0 < 60
