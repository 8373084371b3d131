"""kill -9 at chosen and random moments, then --resume: the metrics equal an uninterrupted run's, no
temporary file is left, nothing is lost or listed twice. For `train` with several rules (MAC's per-sample
coordinates included) and for `admm` in both modes. The default run makes a handful of trials; the `slow`
soak makes 60.

Kill moments: at start-up (before or while config.json is written), after some epochs, while a
checkpoint's temporary file exists (mid-write), and at random times.
"""
import functools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferlearn.atomic import read_jsonl

ENV = dict(os.environ, OMP_NUM_THREADS="1")
DROP = {"epoch_seconds", "theta_seconds", "z_dual_seconds"}
COMMANDS = {
    "train-backprop": ["train", "--data", "digits", "--arch", "64-32-10", "--epochs", "12", "--batch-size", "32",
                       "--seed", "1"],
    "train-contrastive": ["train", "--data", "digits", "--arch", "64-24-10", "--rule", "contrastive", "--epochs", "6",
                          "--batch-size", "64", "--seed", "2", "--limit-train", "600"],
    "train-pc": ["train", "--data", "digits", "--arch", "64-24-10", "--rule", "pc", "--epochs", "6", "--batch-size",
                 "64", "--seed", "3", "--limit-train", "600"],
    "train-mac": ["train", "--data", "digits", "--arch", "64-24-10", "--rule", "mac", "--epochs", "6", "--batch-size",
                  "64", "--seed", "6", "--limit-train", "600"],   # per-sample coordinates in the checkpoint
    "admm-batch": ["admm", "--data", "digits", "--arch", "64-24-10", "--epochs", "6", "--batch-size", "64",
                   "--seed", "4", "--limit-train", "600"],
    "admm-online": ["admm", "--data", "digits", "--arch", "64-24-10", "--epochs", "6", "--mode", "online",
                    "--batch-size", "64", "--seed", "5", "--limit-train", "600"],
}


def _run(args, out, timeout=300):
    return subprocess.run([sys.executable, "-m", "inferlearn", *args, "--out", str(out), "--quiet"], env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@functools.lru_cache(maxsize=None)
def _reference(name: str, root: str) -> tuple:
    res = _run(COMMANDS[name], Path(root) / f"ref-{name}")
    assert res.returncode == 0, res.stderr
    return tuple(_strip(read_jsonl(Path(root) / f"ref-{name}" / "metrics.jsonl")))


def _strip(rows):
    return [tuple(sorted((k, v) for k, v in r.items() if k not in DROP)) for r in rows]


def _kill_at(proc, out: Path, moment: str, rng: random.Random) -> None:
    """Wait for ``moment`` in the run folder (or the process's end), then SIGKILL."""
    deadline = time.time() + 120
    metrics = out / "metrics.jsonl"
    if moment == "startup":
        time.sleep(rng.uniform(0.0, 2.5))
    elif moment == "random":
        time.sleep(rng.uniform(2.0, 8.0))
    while time.time() < deadline and proc.poll() is None and moment not in ("startup", "random"):
        if moment == "tmp" and any(out.glob(".checkpoint.pt.*.tmp")):
            break
        if moment == "epochs" and metrics.exists() and len(read_jsonl(metrics)) >= 2:
            break
        time.sleep(0.001 if moment == "tmp" else 0.02)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_trial(name: str, moment: str, root: Path, seed: int) -> None:
    ref = _reference(name, str(root))
    out = root / f"run-{name}-{moment}-{seed}"
    proc = subprocess.Popen([sys.executable, "-m", "inferlearn", *COMMANDS[name], "--out", str(out), "--quiet"],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_at(proc, out, moment, random.Random(seed))
    command = COMMANDS[name][0]
    res = subprocess.run([sys.executable, "-m", "inferlearn", command, "--resume", str(out), "--quiet"]
                         if (out / "config.json").exists() else
                         [sys.executable, "-m", "inferlearn", *COMMANDS[name], "--out", str(out), "--quiet", "--overwrite"],
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{name} killed at {moment}: resume failed: {res.stderr}"
    assert tuple(_strip(read_jsonl(out / "metrics.jsonl"))) == ref, f"{name} killed at {moment}: metrics differ"
    assert not list(out.glob(".*.tmp")), f"{name} killed at {moment}: a temporary file was left behind"


@pytest.mark.parametrize("name, moment", [("train-contrastive", "tmp"), ("train-pc", "epochs"),
                                          ("admm-batch", "tmp"), ("admm-online", "epochs"),
                                          ("train-backprop", "startup"), ("train-mac", "epochs")])
def test_kill_then_resume(tmp_path_factory, name, moment):
    """Guards against state missing from checkpoints, metrics lines lost or duplicated around a
    checkpoint, and a folder left unusable by a kill at start-up."""
    kill_trial(name, moment, tmp_path_factory.mktemp("kill"), seed=0)


@pytest.mark.slow
def test_kill_soak(tmp_path_factory):
    """60 kill trials at random and chosen moments across every command above: 0 failures."""
    root = tmp_path_factory.mktemp("soak")
    rng = random.Random(2026)
    trials = [(name, moment) for name in COMMANDS for moment in ("startup", "epochs", "tmp", "random")]
    trials += [(rng.choice(list(COMMANDS)), "random") for _ in range(60 - len(trials))]
    for i, (name, moment) in enumerate(trials):
        kill_trial(name, moment, root, seed=i)


# ---- two processes: kill the launcher or one worker, at random times and during checkpoint writes ------------
PARALLEL = {
    "train2-contrastive": ["train", "--data", "digits", "--arch", "64-24-10", "--rule", "contrastive", "--epochs", "6",
                           "--batch-size", "64", "--seed", "2", "--limit-train", "600", "--nproc", "2"],
    "train2-mac": ["train", "--data", "digits", "--arch", "64-24-10", "--rule", "mac", "--epochs", "6", "--batch-size",
                   "64", "--seed", "6", "--limit-train", "600", "--nproc", "2"],
    "admm2": ["admm", "--data", "digits", "--arch", "64-24-24-10", "--epochs", "6", "--batch-size", "64", "--seed", "4",
              "--limit-train", "600", "--nproc", "2"],
}
TIMINGS = frozenset({"epoch_seconds", "compile_seconds", "theta_seconds", "z_dual_seconds", "payload_sha256"})


def _pids(tag: str) -> dict[int, int]:
    """rank -> pid of the live workers of the run tagged ``tag``."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError, ValueError):
                continue
            if env.get(b"INFERLEARN_SOAK_TAG") == tag.encode() and b"RANK" in env and state != "Z":
                out[int(env[b"RANK"])] = int(proc.name)
    return out


@functools.lru_cache(maxsize=None)
def _parallel_reference(name: str, root: str) -> str:
    out = Path(root) / f"ref-{name}"
    res = subprocess.run([sys.executable, "-m", "inferlearn", *PARALLEL[name], "--out", str(out), "--quiet"], env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return str(out)


def parallel_kill_trial(name: str, target: str, moment: str, root: Path, seed: int) -> None:
    """Kill ``target`` (the launcher, or worker 0 or 1) of a ``--nproc 2`` run at ``moment``, resume with
    ``--nproc 2``: the metrics and every tensor of the final checkpoint equal an uninterrupted run's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    from oracle_helpers import assert_same_tree

    ref = Path(_parallel_reference(name, str(root)))
    out, tag, rng = root / f"run-{name}-{target}-{moment}-{seed}", f"soak-{seed}-{os.getpid()}", random.Random(seed)
    env = dict(ENV, INFERLEARN_SOAK_TAG=tag)
    proc = subprocess.Popen([sys.executable, "-m", "inferlearn", *PARALLEL[name], "--out", str(out), "--quiet"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    if moment == "random":
        time.sleep(rng.uniform(3.0, 12.0))
    while moment != "random" and time.time() < deadline and proc.poll() is None:
        if moment == "tmp" and any(out.glob(".checkpoint.pt.*.tmp")):
            break
        if moment == "epochs" and (out / "metrics.jsonl").exists() and len(read_jsonl(out / "metrics.jsonl")) >= 2:
            break
        time.sleep(0.001 if moment == "tmp" else 0.02)
    if proc.poll() is None:
        pid = proc.pid if target == "launcher" else _pids(tag).get(int(target[-1]))
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=120)
    while _pids(tag) and time.time() < deadline:   # the workers die with their launcher
        time.sleep(0.05)
    assert not _pids(tag), f"{name}: a worker outlived its launcher"
    command = PARALLEL[name][0]
    args = ([command, "--resume", str(out), "--nproc", "2"] if (out / "config.json").exists()
            else [*PARALLEL[name], "--out", str(out), "--overwrite"])
    res = subprocess.run([sys.executable, "-m", "inferlearn", *args, "--quiet"], env=ENV, capture_output=True,
                         text=True, timeout=600)
    where = f"{name}, {target} killed at {moment} (trial {seed})"
    assert res.returncode == 0, f"{where}: resume failed: {res.stderr}"
    assert _strip(read_jsonl(out / "metrics.jsonl")) == _strip(read_jsonl(ref / "metrics.jsonl")), f"{where}: metrics differ"
    got, want = (torch.load(f / "checkpoint.pt", map_location="cpu", weights_only=False) for f in (out, ref))
    assert assert_same_tree(got, want, where, skip=TIMINGS) > 0
    assert not list(out.glob(".*.tmp")), f"{where}: a temporary file was left behind"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find the workers")
def test_kill_soak_two_processes(tmp_path_factory):
    """30 kill trials of `train --nproc 2` (contrastive; MAC with its shared per-sample coordinates) and
    `admm --nproc 2`: the launcher or one worker, at random times, after some epochs and during checkpoint
    writes. 0 failures: resumed metrics and every checkpoint tensor (model, optimiser, scheduler, rule
    state, ADMM state) equal an uninterrupted run's."""
    root = tmp_path_factory.mktemp("soak2")
    rng = random.Random(22)
    trials = [(name, target, moment) for name in PARALLEL for target in ("launcher", "worker1")
              for moment in ("random", "tmp", "epochs")]
    trials += [(rng.choice(list(PARALLEL)), rng.choice(["launcher", "worker0", "worker1"]), rng.choice(["random", "tmp"]))
               for _ in range(30 - len(trials))]
    for i, (name, target, moment) in enumerate(trials):
        parallel_kill_trial(name, target, moment, root, seed=i)
