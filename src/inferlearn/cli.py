"""The ``inferlearn`` command line. Each subcommand lives in ``inferlearn/commands/<name>.py`` and
exposes ``register(subparsers)``; add new ones to :data:`COMMANDS`."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import warnings

from . import __version__
from .errors import DistributedError, InferlearnError, Interrupted, WriteError

COMMANDS = [
    "inferlearn.commands.train",
    "inferlearn.commands.compare",
    "inferlearn.commands.data",
    "inferlearn.commands.admm",
    "inferlearn.commands.reproduce",
    "inferlearn.commands.benchmark",
]

#: seconds a launched process waits before reporting a lost peer: the launcher's agent, stopping every process
#: after a signal, sends SIGTERM to them one after another, and a process whose peer ended first would otherwise
#: print "another process died" beside the launcher's "interrupted" line
LOST_PEER_GRACE_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlearn", description="Train neural networks by inference learning.")
    parser.add_argument("--version", action="version", version=f"inferlearn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"inferlearn: warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _one_line_warning   # a user sees one line per warning, not our source lines
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # for --nproc, which re-runs the command
    if os.environ.get("WORLD_SIZE", "1") != "1":
        from .distributed.launch import die_with_launcher

        die_with_launcher()
    try:
        rc = int(args.func(args) or 0)
        if os.environ.get("WORLD_SIZE", "1") != "1":
            _leave(rc)   # a launched process: skip the process group's destructors (they race at exit)
        return rc
    except Interrupted as exc:   # the --nproc launcher stopped by a signal: one line with the resume command
        print(f"inferlearn: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except (InferlearnError, ValueError) as exc:
        launched = os.environ.get("WORLD_SIZE", "1") != "1"
        where = f"process {os.environ.get('RANK', '?')}: " if launched and not isinstance(exc, DistributedError) else ""
        if launched and isinstance(exc, DistributedError):
            # a lost peer: when the launcher is stopping every process (a signal to the launcher), its SIGTERM
            # reaches this one within the grace and ends it silently, so the user reads the launcher's one line
            time.sleep(LOST_PEER_GRACE_S)
        hint = ""
        if isinstance(exc, WriteError):   # a full disk mid-run: say how to continue once there is room
            from .commands.common import resume_hint

            hint = resume_hint(args)
        print(f"inferlearn: error: {where}{exc}" + (f"; then {hint}" if hint else ""), file=sys.stderr)
        if launched:   # a process group aborts the interpreter in its destructors: leave at once
            _leave(2)
        return 2
    except KeyboardInterrupt:
        from .commands.common import resume_hint

        launched = os.environ.get("WORLD_SIZE", "1") != "1"
        where = f"process {os.environ.get('RANK', '?')}: " if launched else ""
        hint = resume_hint(args)
        print(f"inferlearn: {where}interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        if launched:
            _leave(130)
        return 130


def _leave(rc: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    raise SystemExit(main())
