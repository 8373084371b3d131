"""`pip install .` (not only the editable install) gives a working package: a wheel with every
subpackage, the py.typed marker and the one version string that `inferlearn --version` prints."""
import subprocess
import sys
import zipfile
from pathlib import Path

import inferlearn

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contents_and_version(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("inferlearn-*.whl")
    assert wheel.name.startswith(f"inferlearn-{inferlearn.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ["inferlearn/py.typed", "inferlearn/engine/problems/layered.py", "inferlearn/engine/graph/reader.py",
                  "inferlearn/engine/solvers/block_pg.py", "inferlearn/rules/predictive_coding.py",
              "inferlearn/bilevel/layer.py", "inferlearn/admm/trainer.py", "inferlearn/training/run_folder.py",
              "inferlearn/data/datasets.py", "inferlearn/experiments/lifted_tables.py"]:
        assert f in names, f


def test_cli_version(capsys):
    from inferlearn.cli import main
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"inferlearn {inferlearn.__version__}"
