"""One run at a time in a run folder: the writing process holds an advisory ``fcntl`` lock on
``.lock`` for its lifetime. A second run, ``--resume`` or ``--overwrite`` into the folder is refused in
one line naming the holder's PID (before, both ran and interleaved ``metrics.jsonl``, and one could delete
the other's half-written checkpoint); a ``--nproc 2`` run is held by its launcher; the lock goes with the
process.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferlearn.errors import RunFolderError
from inferlearn.training.run_folder import RunFolder

CLI = [sys.executable, "-m", "inferlearn"]
TRAIN = ["train", "--data", "digits", "--arch", "64-32-10", "--batch-size", "32", "--quiet"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _try_lock(folder: Path) -> subprocess.CompletedProcess:
    code = ("import sys\nfrom inferlearn.training.run_folder import RunFolder\n"
            "try:\n    RunFolder(sys.argv[1])\nexcept Exception as e:\n    print(e); sys.exit(2)\n")
    return subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)


def _epochs(folder: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _wait_for_epoch(folder: Path, proc, deadline: float) -> None:
    while time.time() < deadline:
        assert proc.poll() is None, "the first run ended early"
        if (folder / "metrics.jsonl").exists() and _epochs(folder):
            return
        time.sleep(0.05)
    raise AssertionError("the first run never finished an epoch")


def _refused(r: subprocess.CompletedProcess, folder: Path, pid: int) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{folder} is in use by another inferlearn run (PID {pid})" in r.stderr, r.stderr


def test_a_folder_is_locked_by_its_writer_until_closed(tmp_path):
    folder = tmp_path / "run"
    held = RunFolder(folder)
    again = RunFolder(folder)   # the same process may open it again (re-entrant)
    r = _try_lock(folder)
    assert r.returncode == 2 and f"in use by another inferlearn run (PID {os.getpid()})" in r.stdout
    held.close()
    assert _try_lock(folder).returncode == 2   # `again` still holds it
    again.close()
    assert _try_lock(folder).returncode == 0, "the lock outlived its holders"
    with pytest.raises(RunFolderError, match="Invalid output folder ''"):
        RunFolder("")


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_run_or_resume_into_a_running_folder_is_refused(tmp_path, nproc):
    """The first run is long enough (20,000 epochs, killed at the end) that it cannot finish before the second
    command starts on a loaded machine (with 400 epochs it once did, and the resume then found the folder free)."""
    run = tmp_path / "run"
    extra = ["--nproc", "2"] if nproc > 1 else []
    first = subprocess.Popen(CLI + TRAIN + ["--epochs", "20000", "--out", str(run)] + extra, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_epoch(run, first, time.time() + 180)
        # the holder is the command's own process: the one-process run, or the launcher of the --nproc run
        tries = [["train", "--resume", str(run), "--quiet"] + extra]
        if nproc == 1:
            tries.append(TRAIN + ["--epochs", "20000", "--out", str(run), "--overwrite"])
        for args in tries:
            r = subprocess.run(CLI + args, env=_env(), capture_output=True, text=True, timeout=120)
            _refused(r, run, first.pid)
            assert first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    done = _epochs(run)
    assert done == list(range(1, len(done) + 1))   # nothing interleaved
    if nproc == 1:
        return
    time.sleep(0.5)   # the launcher's workers die with it (SIGKILL from the kernel)
    r = subprocess.run(CLI + ["train", "--resume", str(run), "--epochs", str(len(done) + 1), "--quiet"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr   # the lock went with the killed process


def test_two_simultaneous_starts_one_proceeds(tmp_path):
    run = tmp_path / "run"
    procs = [subprocess.Popen(CLI + TRAIN + ["--epochs", "60", "--out", str(run)], env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=240), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], results
    err = next(e for rc, e in results if rc == 2)
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    # refused by the lock, or (when the other had already finished) as a folder holding a run
    assert "is in use by another inferlearn run (PID" in err or "already holds a run" in err, err
    assert _epochs(run) == list(range(1, 61))
