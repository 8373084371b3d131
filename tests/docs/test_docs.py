"""The documentation site builds in strict mode: every page in the navigation exists, every internal
link and embedded results file resolves, and every docstring the API reference renders parses."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    """Without ``-q``: quiet mode drops the warnings that strict mode counts (a docstring parameter without a
    type passed unnoticed), so the build runs at its normal level and every warning fails the test."""
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    warnings = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("WARNING")]
    assert not warnings, f"{len(warnings)} warnings:\n" + "\n".join(warnings)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").stat().st_size > 10000


def test_docs_extra_is_pinned_like_requirements():
    """``pip install .[docs]`` gets the versions the strict build is tested with (requirements.txt)."""
    import re

    import pytest

    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    assert extra
    for req in extra:
        name, sep, version = req.partition("==")
        assert sep and pins.get(name) == version, f"docs extra {req!r}: requirements.txt pins {pins.get(name)}"


def test_docstrings_do_not_cite_files_outside_the_repository():
    """The maths the docstrings refer to lives in docs/maths.md, not in a file next to the repository."""
    for path in (ROOT / "src").rglob("*.py"):
        text = path.read_text()
        assert "MATH.md" not in text and "../shared" not in text, path


def test_readme_first_commands_install_and_run_the_main_job_then_the_tests():
    """A newcomer's first two commands: the one that installs and runs the main job, the one that tests."""
    import re
    first = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands[:2] == ["./scripts/demo.sh", "./scripts/test.sh"], commands
    for script in commands[:2]:   # each installs first
        assert "./scripts/setup.sh" in (ROOT / script).read_text(), script


def test_readme_links_resolve():
    """The README is not part of the site, so the strict build does not check its links: check them here."""
    import re
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]
    assert links, "the README links to no page"
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_inferlearn_name_the_docs_mention_resolves():
    """Guards against docs naming modules that moved (``inferlearn.blocks``, ``inferlearn.solvers`` once did): every
    dotted ``inferlearn.…`` name in the README and ``docs/`` imports, or is an attribute of what imports."""
    import importlib
    import re

    root = Path(__file__).resolve().parents[2]

    def resolves(name):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
        return False

    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    names = {(m.group(0), p.relative_to(root).as_posix()) for p in pages
             for m in re.finditer(r"\binferlearn(?:\.[A-Za-z_][A-Za-z0-9_]*)+", p.read_text())}
    assert len(names) > 50
    stale = sorted((n, page) for n, page in names if not resolves(n))
    assert not stale, stale
