"""``--nproc N``: start N copies of a command with the elastic launcher (``torch.distributed.run``).

``inferlearn train --nproc 2 ...`` re-runs ``python -m inferlearn train ...`` (without ``--nproc``) in
two processes on this machine, joined over loopback: the same as ``torchrun --nproc-per-node 2 -m
inferlearn train ...``. No restarts: a process that fails ends the run, the launcher stops the
others, and the run resumes from its last checkpoint (``--resume OUT``) with any number of
processes.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import uuid

from ..errors import DistributedError, Interrupted


LAUNCHER_PID = "INFERLEARN_LAUNCHER_PID"


def die_with_launcher() -> None:
    """In a process started by :func:`launch`: be killed when the launcher dies (Linux).

    The elastic launcher starts each worker in a session of its own, so ``kill -9`` of the launcher (or
    of its process group) would leave the workers training on, and writing the run folder, beside a
    ``--resume``. ``PR_SET_PDEATHSIG`` makes the kernel send them ``SIGKILL`` instead.
    """
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    if os.getppid() != int(launcher):   # the launcher died before the call above
        os._exit(1)


def free_port() -> int:
    """A TCP port free on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strip_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def check_nproc(nproc: int) -> int:
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"Invalid --nproc {nproc}: must be an integer ≥ 1")
    if nproc > 1 and os.environ.get("WORLD_SIZE", "1") != "1":
        raise ValueError("--nproc given inside a launched run (WORLD_SIZE is set): use either torchrun or --nproc")
    return nproc


def _stop_workers_with_sigterm() -> list[int]:
    """Make the elastic agent stop its processes with SIGTERM whichever signal stopped the launcher.

    The agent passes the signal it received on to the processes: a Ctrl-C would then make every process
    print its own "interrupted" line beside the launcher's. Under SIGTERM they end silently, and the
    launcher prints the one line. Returns the list that records the signals received.
    """
    import signal

    from torch.distributed.elastic.multiprocessing import api

    received: list[int] = []
    original = getattr(api, "_terminate_process_handler", None)
    if original is None or not hasattr(api, "SignalException"):   # another torch: keep its behaviour
        return received

    def handler(signum, frame):
        received.append(signum)
        raise api.SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.SIGTERM)

    api._terminate_process_handler = handler
    return received


def launch(argv: list[str], nproc: int, resume_hint: str) -> int:
    """Run ``python -m inferlearn *argv`` in ``nproc`` processes on loopback; 0 when all succeeded.

    Raises:
        DistributedError: a process failed (the message names the rank, its exit code, and how to resume).
    """
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the elastic agent logs every step and failure at INFO/ERROR with a traceback (and its modules set
    # their own loggers' levels); the user gets our one line instead (each rank prints its own error line)
    for name in ["torch.distributed.elastic", "torch.distributed.launcher",
                 *[n for n in logging.root.manager.loggerDict if n.startswith(("torch.distributed.elastic",
                                                                               "torch.distributed.launcher"))]]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    received = _stop_workers_with_sigterm()
    port = free_port()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:8],
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}", rdzv_configs={"timeout": 60},
                          max_restarts=0, monitor_interval=0.1, start_method="spawn",
                          local_addr="127.0.0.1", shutdown_timeout=5)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # one thread per rank unless told otherwise
    os.environ[LAUNCHER_PID] = str(os.getpid())      # the workers die with this process (die_with_launcher)
    try:
        elastic_launch(config, sys.executable)("-m", "inferlearn", *argv)
    except SignalException as exc:   # SIGTERM/SIGINT/SIGHUP of the launcher: the agent has stopped the processes
        signum = received[-1] if received else int(exc.sigval)
        name = signal.Signals(signum).name
        raise Interrupted(f"interrupted by {name}" + (f"; {resume_hint}" if resume_hint else ""), signum=signum) from None
    except KeyboardInterrupt:   # before the agent's handlers were installed
        raise Interrupted("interrupted" + (f"; {resume_hint}" if resume_hint else ""), signum=signal.SIGINT) from None
    except ChildFailedError as exc:
        parts = []
        for rank, failure in sorted(exc.failures.items()):
            code = failure.exitcode
            parts.append(f"process {rank} of {nproc} " + (f"was killed by signal {-code}" if code < 0
                                                          else f"failed (exit code {code})"))
        raise DistributedError("; ".join(parts) + f" (their own messages, if any, are above); {resume_hint}") from None
    return 0
