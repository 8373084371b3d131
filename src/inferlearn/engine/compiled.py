"""Compiled inference steps: ``torch.compile`` one step of each iterative rule and reuse it.

Every iterative rule repeats one small step many times per mini-batch: a block projected-gradient
sweep of the lifted solvers (contrastive, J_0, EqProp, lifted-Fenchel), a simultaneous gradient
step of predictive coding; back-propagation is one step per batch. On a small MLP each step is a
few matrix products and a dozen element-wise operations, so eager PyTorch spends most of its time
dispatching operations one by one. A :class:`CompiledStep` wraps the step function (a pure function
of tensors and constants, used by the eager path too) and, when compilation is on, runs it through
``torch.compile(dynamic=False)``: one compiled graph per input shape, reused across steps, batches
and epochs (never the unrolled loop). On CUDA the default compiled mode is ``"reduce-overhead"``,
which captures the step with CUDA graphs.

The mode is an argument: of one call (``rule.backward(model, x, labels, compile="on")``), or of a block with
:func:`compiling` (this thread only; the training loop runs each epoch in ``compiling(TrainConfig.compile)``, which
``inferlearn train --compile`` sets)::

    from inferlearn.engine.compiled import compiling
    with compiling("on"):
        rule.backward(model, x, labels)

Outside both the mode is ``"off"`` (:func:`set_compile`, a process-wide default, is deprecated).

Modes (:data:`COMPILE_MODES`): ``"auto"`` (on for CUDA tensors; on CPU, where one compiled step is slower than
eager and compiling takes seconds, only the whole-batch graphs, predictive coding's, and only for a run
of at least :data:`AUTO_CPU_MIN_BATCHES` mini-batches: the rule the measurements in
``benchmarks/results/compile.md`` give), ``"on"`` (CUDA graphs on CUDA, inductor's C++ kernels on CPU),
``"no-cudagraphs"`` (compiled, without CUDA graphs) and ``"off"`` (eager).

If compilation is unavailable or fails (no C++ compiler, an unsupported PyTorch build, an error in
a backend), the step runs eagerly and one :class:`CompileWarning` is issued for the whole process;
no later step tries again. Shapes beyond :data:`MAX_SHAPES` per step also run eagerly, so a
process compiles a bounded number of graphs (the training loop runs an epoch's last, partial batch
eagerly rather than compiling its shape). Compile time (the first call of each shape) is summed in :func:`compile_seconds`.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable

import torch

COMPILE_MODES = ("auto", "off", "on", "no-cudagraphs")
MAX_SHAPES = 16     # compiled graphs per step function; further shapes run eagerly
MEASURE_CALLS = 3   # timed calls of each variant before a measuring step keeps the faster (``CompiledStep``'s measure)
#: ``auto`` compiles a whole-batch graph on CPU only for a run of at least this many mini-batches: compiling
#: predictive coding's graph takes 10-25 s cold (a few seconds from inductor's on-disk cache) and saves about
#: 0.5-2 ms a batch on the MNIST MLP (compiled / eager 0.57 at batch 50, 0.74 at 256;
#: ``benchmarks/results/compile.md``), so shorter runs would spend more compiling than they save
AUTO_CPU_MIN_BATCHES = 10_000


class CompileWarning(RuntimeWarning):
    """``torch.compile`` is unavailable or failed: the steps run eagerly (issued once per process); or a run asked
    for compilation and its rule has no compiled step for the model (issued once per run by the training loop)."""


_state = threading.local()
_steps: "weakref.WeakSet[CompiledStep]" = weakref.WeakSet()   # every step, so tests can drop their graphs
_global = {"mode": "off", "failed": False, "warned": False, "seconds": 0.0, "graphs": 0, "planned": 0, "decisions": [],
           "choices": {}, "calls": 0}


def check_compile_mode(mode: str) -> str:
    """Validate a mode name (one of :data:`COMPILE_MODES`)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"Invalid compile mode: {mode!r}; choose one of {list(COMPILE_MODES)}")
    return mode


def set_compile(mode: str) -> str:
    """Set the process-wide compile mode; returns the previous one. Deprecated: pass the mode where it applies,
    ``rule.backward(..., compile=mode)`` or a :func:`compiling` block."""
    warnings.warn("inferlearn.engine.compiled.set_compile (a process-wide mode) is deprecated; pass compile= to "
                  "rule.backward, or run the block in compiling(mode)", DeprecationWarning, stacklevel=2)
    check_compile_mode(mode)
    old = _global["mode"]
    _global["mode"] = mode
    return old


def compile_mode() -> str:
    """The compile mode in effect (a :func:`compiling` block's, else the process-wide one)."""
    return getattr(_state, "mode", None) or _global["mode"]


@contextlib.contextmanager
def compiling(mode: str = "on"):
    """Run a block with compile mode ``mode`` (this thread only)."""
    check_compile_mode(mode)
    old = getattr(_state, "mode", None)
    _state.mode = mode
    try:
        yield
    finally:
        _state.mode = old


@contextlib.contextmanager
def planned_batches(n: int):
    """Declare that the enclosed block trains ``n`` mini-batches (the training loop does), for ``auto``'s choice."""
    old = _global["planned"]
    _global["planned"] = int(n)
    try:
        yield
    finally:
        _global["planned"] = old


def torch_mode(mode: str, device: torch.device, whole_batch: bool = False, auto_cpu_min_batches: int | None = None
               ) -> str | None:
    """The ``torch.compile`` mode for ``mode`` on ``device`` (``None``: eager). ``auto`` on CPU compiles only
    ``whole_batch`` graphs, and only inside :func:`planned_batches` of at least :data:`AUTO_CPU_MIN_BATCHES`,
    and steps with their own ``auto_cpu_min_batches``, inside :func:`planned_batches` of at least that many."""
    if mode == "auto" and device.type != "cuda":
        least = auto_cpu_min_batches if auto_cpu_min_batches is not None else (
            AUTO_CPU_MIN_BATCHES if whole_batch else None)
        return "default" if least is not None and _global["planned"] >= least else None
    if mode == "off":
        return None
    if device.type == "cuda" and mode in ("on", "auto"):
        return "reduce-overhead"          # CUDA graphs
    return "default"


def compile_seconds() -> float:
    """Seconds spent compiling (the first call of every compiled shape) since the process started."""
    return _global["seconds"]


def compiled_calls() -> int:
    """How many step calls ran compiled (or compiling, or on trial) since the process started: unchanged across
    an epoch under ``on`` means that the rule has no compiled step for the model."""
    return _global["calls"]


def compiled_graphs() -> int:
    """How many step graphs have been compiled since the process started."""
    return _global["graphs"]


def compile_decisions() -> list[str]:
    """What the measuring steps chose since the process started, one line each (``CompiledStep``'s ``measure``)."""
    return list(_global["decisions"])


def compile_failed() -> bool:
    """Whether compilation failed (and the steps run eagerly) in this process."""
    return _global["failed"]


def reset_compile_state(graphs: bool = False) -> None:
    """Forget a failure and the counters (tests); compiled graphs stay cached in their steps unless ``graphs``."""
    _global.update(failed=False, warned=False, seconds=0.0, graphs=0, decisions=[], choices={})
    if graphs:
        for step in list(_steps):
            step._graphs.clear()
            step._trials.clear()
            step.measured.clear()


def measured_choices() -> dict[str, bool]:
    """What ``auto``'s measurements kept, by step name: ``True`` compiled, ``False`` eager (the training loop saves it in
    every checkpoint, so that a resumed run replays the choice instead of measuring again: a new measurement may
    choose otherwise, and compiled and eager round differently)."""
    return dict(_global["choices"])


def replay_choices(choices: dict[str, bool]) -> None:
    """Make ``auto``'s measuring steps take these choices (by step name) instead of measuring (``--resume``)."""
    _global["choices"] = {str(k): bool(v) for k, v in dict(choices).items()}


def _fail(name: str, exc: BaseException) -> None:
    _global["failed"] = True
    if not _global["warned"]:
        _global["warned"] = True
        warnings.warn(f"torch.compile is unavailable or failed ({type(exc).__name__}: {str(exc)[:200]}) while "
                      f"compiling {name}; running eagerly (use compile 'off' to silence this)",
                      CompileWarning, stacklevel=3)


def _key(args, strides: bool = False) -> tuple:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), a.dtype, a.device, a.requires_grad) + ((a.stride(),) if strides else ()))
        elif isinstance(a, (list, tuple)):
            out.append(_key(a, strides))
        else:
            out.append(a)
    return tuple(out)


def _first_device(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            d = _first_device(a)
            if d is not None:
                return d
    return torch.device("cpu")


def _fresh_copy(fn: Callable) -> Callable:
    """``fn`` with its own code object: dynamo keeps one cache (and one recompile limit) per code object,
    so each compiled shape gets its own instead of sharing ``torch._dynamo.config.recompile_limit``."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _clone_out(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_clone_out(o) for o in out)
    return out


class CompiledStep:
    """A step function run eagerly or through ``torch.compile`` according to :func:`compile_mode`.

    ``fn`` takes tensors, lists of tensors and hashable constants (floats, bools, ``None``, tuples);
    constants are baked into the graph (a new value is a new shape key). Values that change every
    batch, such as step sizes computed from the weights, must be passed as tensors.

    Args:
        whole_batch: a whole mini-batch's graph (``auto`` compiles it on CPU for long runs, see :func:`torch_mode`).
        auto_cpu_min_batches: the run length from which ``auto`` compiles this step on CPU (``None``: the
            ``whole_batch`` rule).
        autograd: ``fn`` differentiates inside (``torch.autograd.grad``): traced with dynamo's
            ``trace_autograd_ops``, so the backward pass is part of the compiled graph.
        measure: under ``auto`` on CPU, time each new shape's compiled graph against ``fn`` on its first calls
            (:data:`MEASURE_CALLS` each, in turn, after the compiling call) and keep the faster: a step whose
            compiled speed depends on the model (a graph's predictive-coding step). The ratios (compiled / eager)
            are kept in ``measured``.
        guards: ``False`` compiles without dynamo's guards (``guard_filter_fn``; CPU and ``no-cudagraphs``
            graphs): the step's own key, which then includes every tensor's strides, is what selects a graph. For a
            pure ``fn`` whose behaviour depends only on its arguments, run under one grad mode; it saves the
            guards' evaluation on every call (about 40 µs over the fused training step's twenty inputs).
    """

    def __init__(self, fn: Callable, name: str | None = None, whole_batch: bool = False,
                 auto_cpu_min_batches: int | None = None, autograd: bool = False, measure: bool = False,
                 guards: bool = True):
        self.fn, self.name, self.whole_batch = fn, name or fn.__name__, whole_batch
        self.auto_cpu_min_batches, self.autograd, self.guards = auto_cpu_min_batches, autograd, guards
        self.measure, self.measured = measure, {}
        self._graphs: dict = {}
        self._trials: dict = {}   # shapes on trial (measure): key → (graph, eager seconds, compiled seconds)
        _steps.add(self)
        self.__doc__ = fn.__doc__

    def _torch_mode(self, device: torch.device) -> str | None:
        return torch_mode(compile_mode(), device, self.whole_batch, self.auto_cpu_min_batches)

    def _measuring(self, device: torch.device) -> bool:
        """Whether a call on ``device`` measures compiled against eager (``measure``: ``auto`` on CPU)."""
        return self.measure and device.type == "cpu" and compile_mode() == "auto"

    def active(self, device: torch.device) -> bool:
        """Whether a call with tensors on ``device`` would run compiled."""
        return not _global["failed"] and self._torch_mode(device) is not None

    def __call__(self, *args):
        if _global["failed"]:
            return self.fn(*args)
        device = _first_device(args)
        tmode = self._torch_mode(device)
        if tmode is None:
            return self.fn(*args)
        _global["calls"] += 1
        measuring = self._measuring(device)
        key = (tmode, measuring, _key(args, not self.guards))
        graph = self._graphs.get(key)
        if measuring:   # the run's choice (replayed on --resume) decides; else one kept by an earlier run is recorded
            choice = _global["choices"].get(self.name)
            if choice is None and graph is not None:
                _global["choices"][self.name] = graph is not self.fn
            elif choice is False:
                self._graphs[key] = graph = self.fn   # replayed: eager, as measured before
            elif choice:
                measuring = False                 # replayed: compiled, without a new measurement
                graph = None if graph is self.fn else graph
        if graph is self.fn:   # measured slower compiled: eager
            return self.fn(*args)
        if graph is None and key in self._trials:
            return self._trial(key, tmode, args)
        if graph is None:
            if sum(1 for k in self._graphs if k[0] == tmode) >= MAX_SHAPES:
                return self.fn(*args)
            t0 = time.perf_counter()
            how = {"mode": tmode} if self.guards or tmode != "default" else {
                "options": {"guard_filter_fn": _no_guards}}
            try:
                graph = torch.compile(_fresh_copy(self.fn), dynamic=False, fullgraph=True, **how)
                out = self._run(graph, tmode, args)
            except Exception as exc:   # noqa: BLE001 -- any backend failure: eager, one warning
                _fail(self.name, exc)
                return self.fn(*args)
            _global["seconds"] += time.perf_counter() - t0
            _global["graphs"] += 1
            if measuring:
                self._trials[key] = (graph, [], [])
            else:
                self._graphs[key] = graph
            return out
        return self._run(graph, tmode, args)

    def _trial(self, key, tmode: str, args):
        """One timed call of a shape on trial (``measure``): eager and compiled in turn, :data:`MEASURE_CALLS` each;
        then the faster (by the median) is kept for the shape: its graph, or ``fn`` itself."""
        graph, eager, comp = self._trials[key]
        t0 = time.perf_counter()
        if len(eager) <= len(comp):
            out = self.fn(*args)
            eager.append(time.perf_counter() - t0)
        else:
            out = self._run(graph, tmode, args)
            comp.append(time.perf_counter() - t0)
        if len(comp) >= MEASURE_CALLS:
            del self._trials[key]
            ratio = statistics.median(comp) / statistics.median(eager)
            self._graphs[key] = graph if ratio < 1.0 else self.fn
            self.measured[key[2]] = ratio
            _global["choices"].setdefault(self.name, ratio < 1.0)
            _global["decisions"].append(f"{self.name}: compiled took {ratio:.2f}x eager's time, "
                                        f"kept {'compiled' if ratio < 1.0 else 'eager'}")
        return out

    def resolved(self, *args) -> Callable:
        """What a call with ``args`` runs now: its compiled graph (compiled by an earlier call), else the eager
        function. A caller that makes the same call many times (same shapes and constants) may keep it and skip
        this step's per-call lookup; it must look again when the shapes, the constants or the mode change."""
        device = _first_device(args)
        tmode = None if _global["failed"] else self._torch_mode(device)
        key = (tmode, self._measuring(device), _key(args, not self.guards))
        graph = None if tmode is None else self._graphs.get(key)
        if graph is None:
            return self.fn
        if tmode == "reduce-overhead" or self.autograd:
            return lambda *a: self._run(graph, tmode, a)
        return graph

    def _run(self, graph, tmode: str, args):
        with _tracing_autograd() if self.autograd else contextlib.nullcontext():
            if tmode == "reduce-overhead":
                # CUDA graphs reuse their output buffers on the next replay: mark the step and hand out copies
                torch.compiler.cudagraph_mark_step_begin()
                return _clone_out(graph(*args))
            return graph(*args)


def _no_guards(entries) -> list[bool]:
    """A ``guard_filter_fn`` that keeps no guard (see ``CompiledStep``'s ``guards``)."""
    return [False] * len(entries)


def _tracing_autograd():
    """Dynamo traces ``torch.autograd.grad`` into the graph (``trace_autograd_ops``; a recompilation may trace
    again, so every call of such a step runs inside)."""
    import torch._dynamo
    return torch._dynamo.config.patch(trace_autograd_ops=True)


def compiled_step(fn: Callable) -> CompiledStep:
    """Decorator form of :class:`CompiledStep`."""
    return CompiledStep(fn)


__all__ = ["COMPILE_MODES", "MAX_SHAPES", "CompileWarning", "CompiledStep", "compiled_step", "check_compile_mode", "set_compile",
           "compile_mode", "compiling", "planned_batches", "torch_mode", "compile_seconds", "compiled_graphs", "compile_failed",
           "compile_decisions",
           "reset_compile_state"]
