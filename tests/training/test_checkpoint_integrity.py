"""Checkpoints carry the SHA-256 of their contents, verified on load: bytes flipped inside a weight
tensor (which ``torch.load`` reads without complaint, and which used to resume silently with altered
weights) are refused in one line naming the file and how to recover; a checkpoint of an older version,
without the checksum, still loads, with a note.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferlearn.errors import RunFolderError
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import train
from inferlearn.training.run_folder import CHECKSUM, payload_digest

CLI = [sys.executable, "-m", "inferlearn"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _flip_inside(path: Path, tensor: torch.Tensor, n: int = 64) -> None:
    """Flip ``n`` bytes in the middle of ``tensor``'s data in the checkpoint file (found by its bytes)."""
    raw = bytearray(path.read_bytes())
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    at = raw.find(data)
    assert at >= 0 and len(data) > 2 * n
    mid = at + len(data) // 2 - n // 2
    for i in range(mid, mid + n):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def _largest(state: dict) -> torch.Tensor:
    return max(state.values(), key=lambda t: t.numel())


def _cfg(tmp_path, epochs):
    return TrainConfig(data="digits", arch="64-32-10", epochs=epochs, batch_size=64, lr=0.05, limit_train=300,
                       out=str(tmp_path / "run"))


def test_flipped_bytes_are_refused_and_an_old_checkpoint_loads_with_a_note(tmp_path):
    train(_cfg(tmp_path, 2), progress=False, log=None)
    path = tmp_path / "run" / "checkpoint.pt"
    good = path.read_bytes()
    ckpt = torch.load(path, weights_only=False)
    assert ckpt[CHECKSUM] == payload_digest({k: v for k, v in ckpt.items() if k != CHECKSUM})
    weight = _largest(ckpt["model"])
    _flip_inside(path, weight)
    flipped = torch.load(path, weights_only=False)["model"]   # torch.load itself notices nothing
    assert sum(not torch.equal(flipped[k], v) for k, v in ckpt["model"].items()) == 1
    with pytest.raises(RunFolderError, match=r"checkpoint.pt is corrupted: its contents do not match the checksum.*"
                                             r"copy a previous checkpoint over it"):
        train(_cfg(tmp_path, 3), progress=False, resume=True, log=None)
    # an older version's checkpoint: no checksum; it resumes, and says so
    path.write_bytes(good)
    del ckpt[CHECKSUM]
    torch.save(ckpt, path)
    notes = []
    history = train(_cfg(tmp_path, 3), progress=False, resume=True, log=notes.append)
    assert [r["epoch"] for r in history] == [1, 2, 3]
    assert any("has no checksum (written by an older inferlearn)" in n for n in notes)
    assert CHECKSUM in torch.load(path, weights_only=False)   # the new checkpoint has one again


def test_digest_covers_every_value_and_ignores_the_device_and_process():
    a = {"w": torch.arange(6.).reshape(2, 3), "step": 3, "history": [{"loss": 0.5}], "g": torch.zeros(0)}
    b = {**a, "w": a["w"].clone()}
    assert payload_digest(a) == payload_digest(b)
    for change in ({"step": 4}, {"history": [{"loss": 0.5000001}]}, {"w": a["w"].double()}, {"w": a["w"].t()}):
        assert payload_digest({**a, **change}) != payload_digest(a), change
    b["w"][1, 2] += 1e-6
    assert payload_digest(a) != payload_digest(b)


@pytest.mark.parametrize("command", ["train", "admm"])
def test_cli_refuses_a_corrupted_checkpoint_in_one_line(tmp_path, command):
    run = tmp_path / "run"
    args = ([command, "--data", "digits", "--arch", "64-32-10", "--epochs", "1", "--batch-size", "64",
             "--limit-train", "300", "--out", str(run), "--quiet"])
    r = subprocess.run(CLI + args, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path = run / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    weight = _largest(ckpt["model"] if command == "train" else ckpt["state"]["blocks"][0])
    _flip_inside(path, weight)
    r = subprocess.run(CLI + [command, "--resume", str(run), "--epochs", "2", "--quiet"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"Checkpoint {path} is corrupted" in r.stderr and "copy a previous checkpoint" in r.stderr
