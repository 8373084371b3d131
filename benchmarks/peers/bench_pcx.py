"""inferlearn against its peer PCX (JAX): predictive coding and back-propagation epochs side by side.

PCX is installed in its own virtual environment (``--venv``, default ``~/.cache/inferlearn/peers/pcx-venv``,
created on first use with the pinned versions below; never a dependency of inferlearn). Its side runs in
``pcx_worker.py``, a process started with that venv's python, pinned to the same core(s) as this one and
fed commands one at a time, so that the two libraries' runs interleave (a noisy moment hits both).

Both libraries train the same network from the same initial weights (inferlearn's, exported) on the same
batches in the same order (inferlearn's loader and batch order, exported to a ``.npz`` in a temporary
folder), float32, data in memory:

* MLP ``784-64-64-64-10`` and the conv net ``conv:8-16/64`` (``inferlearn.models.conv_net``: Conv3×3 → ReLU →
  AvgPool2 per stage, Linear 64, Linear 10; in PCX the same layers with one value node after each ReLU);
* predictive coding at T = 15: inferlearn's ``pc`` rule vs PCX (value-node SGD ``η``, weight SGD ``lr``), at
  inferlearn's defaults (η and the recommended SGD rate, read from the library) and at PCX's setting
  (η = 0.3, lr = 0.1);
* back-propagation: inferlearn's ``backprop`` rule vs the same MLP/conv net in plain JAX under ``jax.jit``
  (quadratic loss, SGD, lr 0.05);
* batch 50 and 256; one core (one thread each: ``torch.set_num_threads(1)``; XLA
  ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``), then two cores (two threads).

Epoch time excludes JAX's tracing/compilation (reported separately, with inferlearn's first-batch warm-up)
and evaluation. Each run trains ``--samples`` (MLP) or ``--conv-samples`` (conv net) samples — whole batches
— and the time is scaled to 60 000 samples; the median over ``--repeats`` interleaved repeats is reported.
Test accuracy is measured once (first repeat, one core) after that training.

The floor of each rule is its multiply-add count per epoch, from the layer sizes, divided by the measured
matmul peak (a 1024×1024 float32 ``torch.mm`` on the same core(s) and thread count, best of all repeats).
With ``F`` the forward multiply-adds per sample and ``F₀`` the first layer's (its input is fixed)::

    back-propagation:  F (forward) + F (weight gradients) + (F − F₀) (input gradients)   = 3F − F₀
    predictive coding: F (forward) + T · 2(F − F₀) (each step: one product forward, one transposed)
                       + F (weight gradients)                                            = 2F + 2T(F − F₀)

(2 FLOPs per multiply-add; element-wise work, pooling and the optimiser are not counted.)

Usage::

    python benchmarks/peers/bench_pcx.py                      # the full run (writes benchmarks/results/peers/)
    python benchmarks/peers/bench_pcx.py --quick              # a few batches, into a temporary folder
    python benchmarks/peers/bench_pcx.py --no-pcx             # inferlearn and the floors only

Run it under ``nice`` if you like; it pins itself and the worker with ``--cpus`` (and ``--cpus2``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from inferlearn.data import load_dataset  # noqa: E402
from inferlearn.engine.compiled import compiling  # noqa: E402
from inferlearn.diagnostics import evaluate  # noqa: E402
from inferlearn.errors import DataError  # noqa: E402
from inferlearn.models import build_model  # noqa: E402
from inferlearn.rules import make_rule, recommended_lr  # noqa: E402
from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.training.loop import batch_order, build, run_epoch  # noqa: E402

PINS = ("pcx==0.6.3", "jax==0.4.38", "jaxlib==0.4.38", "equinox==0.11.12", "optax==0.2.5", "chex==0.1.90",
        "numpy==2.4.6")
DEFAULT_VENV = "~/.cache/inferlearn/peers/pcx-venv"
ARCHS = {"mlp": "784-64-64-64-10", "conv": "conv:8-16/64"}
EPOCH = 60_000
T = 15
# inferlearn's defaults, read from the library (PC's value-node step and its recommended SGD rate); T stays 15,
# the setting of the comparison
SETTINGS = {"inferlearn defaults": {"eta": make_rule("pc").step_size, "lr": recommended_lr("pc", "sgd")},
            "PCX setting": {"eta": 0.3, "lr": 0.1}}
BP_LR = 0.05


class BenchError(Exception):
    """A user-facing problem, printed as one line."""


# ---------------------------------------------------------------------------------------------------------------
# The PCX environment


def venv_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv(path: Path, install: bool) -> Path:
    """The PCX venv's python; creates the venv and installs the pins when missing (``install``)."""
    py = venv_python(path)
    if py.exists():
        check = subprocess.run([str(py), "-c", "import pcx, jax"], capture_output=True, text=True, check=False)
        if check.returncode == 0:
            return py
        if not install:
            raise BenchError(f"{path} exists but cannot import pcx/jax ({_last_line(check.stderr)}); "
                             "remove it or rerun without --no-install")
    elif not install:
        raise BenchError(f"no PCX venv at {path}; rerun without --no-install to create it (needs PyPI), or pass --venv")
    print(f"creating the PCX venv in {path} ({' '.join(PINS)}) ...", flush=True)
    if not py.exists():
        try:
            venv.EnvBuilder(with_pip=True).create(path)
        except Exception as exc:  # noqa: BLE001  (permissions, disk, a missing ensurepip)
            raise BenchError(f"cannot create a venv at {path}: {exc}") from None
    pip = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", *PINS],
                         capture_output=True, text=True, check=False)
    if pip.returncode != 0:
        raise BenchError(f"pip could not install PCX into {path} (no network or no matching wheel?): "
                         f"{_last_line(pip.stderr or pip.stdout)}")
    return py


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


class PCXWorker:
    """``pcx_worker.py`` in the PCX venv, pinned to ``cpus`` with ``threads`` XLA threads; JSON lines."""

    def __init__(self, python: Path, data: Path, cpus: list[int], threads: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), JAX_PLATFORMS="cpu", PYTHONNOUSERSITE="1",
                   XLA_FLAGS=("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" if threads == 1 else
                              f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"))
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen([str(python), str(HERE / "pcx_worker.py"), "--data", str(data)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        hello = self._read()
        self.versions = hello.get("versions", {})

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            try:
                self.proc.wait(timeout=30)
                err = self.proc.stderr.read()
            except subprocess.TimeoutExpired:
                err = "no reply"
            raise BenchError(f"the PCX worker stopped: {_last_line(err)}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise BenchError(f"the PCX worker failed: {reply.get('error')}")
        return reply

    def run(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps({"op": "run", **cmd}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


# ---------------------------------------------------------------------------------------------------------------
# Data and weights for the worker


def n_batches(samples: int, batch: int) -> int:
    return max(1, samples // batch)


def export(path: Path, data_dir: str | None, plans: list[tuple[int, int]]) -> None:
    """MNIST from inferlearn's loader, inferlearn's batch orders and initial weights, into ``path`` (.npz)."""
    data = load_dataset("mnist", data_dir)
    arrays = {"train_x": data.train_x.numpy().astype(np.float32), "train_y": data.train_y.numpy(),
              "test_x": data.test_x.numpy().astype(np.float32), "test_y": data.test_y.numpy()}
    for n in sorted({b * nb for b, nb in plans}):
        arrays[f"order_{n}"] = batch_order(n, 0, 1).numpy()   # what run_epoch draws for limit_train = n, epoch 1
    for kind, arch in ARCHS.items():
        model = build_model(arch, "relu", data.n_features, data.n_classes, data.image_shape, seed=0)
        layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        arrays[f"{kind}_layers"] = np.array(len(layers))
        for k, m in enumerate(layers):
            arrays[f"{kind}_w{k}"] = m.weight.detach().numpy().astype(np.float32)
            arrays[f"{kind}_b{k}"] = m.bias.detach().numpy().astype(np.float32)
    np.savez(path, **arrays)


# ---------------------------------------------------------------------------------------------------------------
# Operation counts and the matmul peak


def mac_counts(kind: str) -> tuple[int, int]:
    """``(F, F0)``: multiply-adds per sample of the forward pass and of its first layer."""
    model = build_model(ARCHS[kind], "relu", 784, 10, (1, 28, 28), seed=0)
    macs: list[int] = []

    def hook(m, inp, out):
        if isinstance(m, torch.nn.Linear):
            macs.append(m.in_features * m.out_features)
        else:
            macs.append(m.weight[0].numel() * out[0].numel())   # (C_in·k·k) per output element

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    with torch.no_grad():
        model(torch.zeros(1, 784))
    for h in handles:
        h.remove()
    return sum(macs), macs[0]


def flops_per_epoch(kind: str, method: str) -> float:
    F, F0 = mac_counts(kind)
    macs = 3 * F - F0 if method == "bp" else 2 * F + 2 * T * (F - F0)
    return 2.0 * macs * EPOCH


def matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)
    best = min(_timed(lambda: torch.mm(a, b, out=c)) for _ in range(reps))
    return 2.0 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------------
# inferlearn's side


_MODELS: dict = {}   # (model, method, batch) → the model object every compiled run of that variant trains


def _same_model(s, cfg: TrainConfig, key: tuple):
    """``s`` with its model replaced by the variant's first model object, given ``s``'s initial weights (and a new
    optimiser and schedule on it). A graph's compiled steps belong to one model object (its modules are part of the
    graph), so a fresh model would compile again inside the timed runs; a user's run trains one model."""
    import dataclasses
    import math

    from inferlearn.training.loop import make_optimizer
    from inferlearn.training.schedules import make_schedule

    model = _MODELS.setdefault(key, s.model)
    if model is not s.model:
        model.load_state_dict(s.model.state_dict())
    opt = make_optimizer(cfg.resolved(), [p for p in model.parameters() if p.requires_grad])
    return dataclasses.replace(s, model=model, optimizer=opt, scheduler=make_schedule(cfg.lr_schedule, opt, cfg.epochs, math.ceil(s.train_x.shape[0] / cfg.batch_size)))


def torch_run(kind: str, method: str, batch: int, nb: int, setting: dict, data_dir, evaluate_acc: bool,
              compiled: bool = False) -> dict:
    rule, opts, lr = ("backprop", {}, BP_LR) if method == "bp" else ("pc", {"steps": T, "step_size": setting["eta"]},
                                                                       setting["lr"])
    cfg = TrainConfig(data="mnist", arch=ARCHS[kind], act="relu", rule=rule, rule_options=opts, epochs=1,
                      batch_size=batch, lr=lr, limit_train=batch * nb, data_dir=data_dir, seed=0,
                      out=os.path.join(tempfile.gettempdir(), "inferlearn-peers"))
    s = build(cfg)
    if compiled:
        s = _same_model(s, cfg, (kind, method, batch))
    with compiling("on" if compiled else "off"):   # compiled: one graph per batch shape, reused across runs
        t0 = time.perf_counter()
        run_epoch(s, cfg, 1, progress=False)
        seconds = time.perf_counter() - t0
    acc = evaluate(s.model, s.test_x, s.test_y) if evaluate_acc else None
    return {"seconds": seconds, "test_acc": acc}


def torch_warmup(kind: str, method: str, batch: int, setting: dict, data_dir, compiled: bool = False) -> float:
    """One batch on a fresh model: the first-call cost (allocations, lazy initialisation; compiled: compiling
    the batch's graph, or loading it from inductor's on-disk cache) in this process."""
    return torch_run(kind, method, batch, 1, setting, data_dir, False, compiled)["seconds"]


# ---------------------------------------------------------------------------------------------------------------
# The benchmark


COMPILED = "inferlearn compiled"   # inferlearn with --compile on: one compiled call per batch (PC, BP)


def variants(cores: int, compiled: bool = True) -> list[dict]:
    """What is timed: (method, library, setting). On two cores only one PC setting per library (same work)."""
    mine = ["inferlearn", COMPILED] if compiled else ["inferlearn"]
    out = [{"method": "bp", "lib": lib, "setting": "—"} for lib in mine] + [{"method": "bp", "lib": "JAX jit", "setting": "—"}]
    for name in (SETTINGS if cores == 1 else ["PCX setting"]):
        out += [{"method": "pc", "lib": lib, "setting": name} for lib in mine]
        out += [{"method": "pc", "lib": "PCX", "setting": name}]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring (and docs/peers.md) for the method.")
    p.add_argument("--venv", default=DEFAULT_VENV, help=f"PCX's virtual environment (default {DEFAULT_VENV})")
    p.add_argument("--no-install", action="store_true", help="fail instead of creating the venv when it is missing")
    p.add_argument("--no-pcx", action="store_true", help="inferlearn and the floors only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=EPOCH, help="training samples timed per MLP run (default one epoch)")
    p.add_argument("--conv-samples", type=int, default=12_000, help="training samples timed per conv-net run")
    p.add_argument("--batch-sizes", default="50,256")
    p.add_argument("--batch-sizes2", default="256", help="batch sizes timed on two cores (default 256)")
    p.add_argument("--overhead-batches", type=int, default=200,
                   help="batches of one sample timed on the MLP, one core: the fixed cost per batch (0: skip)")
    p.add_argument("--models", default="mlp,conv")
    p.add_argument("--models2", default="mlp", help="models timed on two cores (default mlp)")
    p.add_argument("--cpus", default=None, help="the one core, e.g. 1 (default: the first core this process may use)")
    p.add_argument("--cpus2", default=None, help="two cores, e.g. 0,1, or 'none' (default: the first two allowed)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/peers; --quick: a temp dir)")
    p.add_argument("--quick", action="store_true", help="a few batches, one repeat (a smoke test)")
    p.add_argument("--no-compiled", action="store_true", help="skip inferlearn's compiled variant (--compile on)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a killed run still removes its temporary folder
    try:
        return run(args, argv)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _models(text: str, option: str) -> list[str]:
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models or not set(models) <= set(ARCHS):
        raise BenchError(f"invalid {option} {text!r}: choose from {','.join(ARCHS)}")
    return models


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"invalid {option} {text!r}: expected positive integers, e.g. 50,256")
    return values


def parse_cpus(text: str | None, count: int) -> list[int] | None:
    allowed = sorted(os.sched_getaffinity(0))
    if text is None:
        return allowed[:count] if len(allowed) >= count else None
    if text.lower() == "none":
        return None
    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        raise BenchError(f"invalid core list {text!r}: expected e.g. 1 or 0,1") from None
    if len(cpus) != count or not set(cpus) <= set(range(os.cpu_count() or 1)):
        raise BenchError(f"invalid core list {text!r}: expected {count} core number(s) below {os.cpu_count()}")
    return cpus


def run(args, argv) -> int:
    if args.quick:
        args.repeats, args.samples, args.conv_samples = 1, 1000, 512
    if args.repeats < 1 or args.samples < 1 or args.conv_samples < 1:
        raise BenchError("--repeats, --samples and --conv-samples must be positive")
    models, models2 = _models(args.models, "--models"), _models(args.models2, "--models2")
    batches, batches2 = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.batch_sizes2, "--batch-sizes2")
    core_sets = [c for c in (parse_cpus(args.cpus, 1), parse_cpus(args.cpus2, 2)) if c]
    if not core_sets:
        raise BenchError("no core to run on")
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "inferlearn-peers-quick" if args.quick
                                          else ROOT / "benchmarks" / "results" / "peers")
    samples = {"mlp": args.samples, "conv": args.conv_samples}
    jobs = {1: [(m, b, n_batches(samples[m], b), False) for m in models for b in batches],
            2: [(m, b, n_batches(samples[m], b), False) for m in models2 for b in batches2]}
    if args.overhead_batches:   # the fixed cost per batch: the MLP at batch 1
        jobs[1].append(("mlp", 1, args.overhead_batches, True))

    pcx_python, pcx_error = None, None
    if not args.no_pcx:
        try:
            pcx_python = ensure_venv(Path(os.path.expanduser(args.venv)), not args.no_install)
        except BenchError as exc:
            pcx_error = str(exc)
            print(f"warning: {exc}; timing inferlearn and the floors only", file=sys.stderr)

    load_dataset("mnist", args.data_dir)     # a missing data set fails here, in one line
    results: list[dict] = []
    peaks: dict[int, list[float]] = {}
    versions: dict = {}
    with tempfile.TemporaryDirectory(prefix="inferlearn-peers-") as tmp:
        data_path = Path(tmp) / "mnist.npz"
        export(data_path, args.data_dir, [(b, nb) for js in jobs.values() for _, b, nb, _ in js])
        for cpus in core_sets:
            threads = len(cpus)
            os.sched_setaffinity(0, cpus)
            torch.set_num_threads(threads)
            worker = None
            if pcx_python is not None:
                try:
                    worker = PCXWorker(pcx_python, data_path, cpus, threads)
                    versions = worker.versions
                except BenchError as exc:
                    pcx_error = str(exc)
                    print(f"warning: {exc}; timing inferlearn and the floors only", file=sys.stderr)
            rows = {}
            try:
                for rep in range(args.repeats):
                    peaks.setdefault(threads, []).append(matmul_gflops())
                    for kind, batch, nb, overhead in jobs[threads]:
                        for v in variants(2 if overhead else threads, not args.no_compiled):
                            key = (kind, batch, threads, v["method"], v["lib"], v["setting"])
                            row = rows.setdefault(key, {"model": kind, "batch": batch, "cores": threads, **v,
                                                        "batches": nb, "samples": nb * batch, "times": [],
                                                        "compile_s": None, "test_acc": None, "error": None,
                                                        "overhead": overhead})
                            setting = SETTINGS.get(v["setting"], {})
                            evaluate_acc = rep == 0 and threads == 1 and not overhead
                            if v["lib"] in ("PCX", "JAX jit"):
                                if worker is None:
                                    row["error"] = f"not run: {pcx_error}" if pcx_error else "not run (--no-pcx)"
                                    continue
                                try:
                                    r = worker.run(model=kind, method=v["method"], batch=batch, batches=nb, steps=T,
                                                   eta=setting.get("eta"), lr=setting.get("lr", BP_LR),
                                                   evaluate=evaluate_acc)
                                except BenchError as exc:
                                    row["error"] = str(exc)
                                    print(f"warning: {exc}", file=sys.stderr)
                                    worker.close()
                                    worker = None
                                    pcx_error = str(exc)
                                    continue
                            else:
                                comp = v["lib"] == COMPILED
                                if row["compile_s"] is None:
                                    row["compile_s"] = torch_warmup(kind, v["method"], batch, setting, args.data_dir, comp)
                                r = torch_run(kind, v["method"], batch, nb, setting, args.data_dir, evaluate_acc, comp)
                            row["times"].append(r["seconds"])
                            if r.get("compile_s") is not None:
                                row["compile_s"] = r["compile_s"]
                            if r.get("test_acc") is not None:
                                row["test_acc"] = r["test_acc"]
                            print(f"rep {rep + 1}/{args.repeats} {threads} core(s) {kind} b{batch} {v['method']} "
                                  f"{v['lib']} [{v['setting']}]: {r['seconds']:.2f} s for {nb} batches"
                                  + (f", acc {r['test_acc']:.4f}" if r.get("test_acc") is not None else ""), flush=True)
            finally:
                if worker is not None:
                    worker.close()
            results += list(rows.values())
    finish(results, peaks, versions, pcx_error, out, args, argv)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Report


def finish(results, peaks, versions, pcx_error, out: Path, args, argv) -> None:
    # best measured peak per core count; two cores are credited at least one core's peak (torch's two-thread
    # matmul beside busy cores can be slower than one thread)
    peak = {c: max(max(v), max(peaks.get(1, [0.0]))) for c, v in peaks.items()}
    for r in results:
        r["per_batch_ms"] = statistics.median(r["times"]) / r["batches"] * 1e3 if r["times"] else None
        r["floor_s"] = flops_per_epoch(r["model"], r["method"]) / (peak[r["cores"]] * 1e9)
        r["epoch_s"] = statistics.median(r["times"]) * EPOCH / r["samples"] if r["times"] else None
        r["vs_floor"] = r["epoch_s"] / r["floor_s"] if r["epoch_s"] else None
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/peers/bench_pcx.py" + ("".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:])))
    meta = {"command": cmd, "peak_gflops": peak, "peak_all": peaks, "pcx_versions": versions,
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "pcx_error": pcx_error, "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "peers.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1, default=str))
    main_rows = [r for r in results if not r["overhead"]]
    text = markdown(main_rows, meta) + overhead_table([r for r in results if r["overhead"]])
    (out / "peers.md").write_text(text)
    plot(main_rows, out / "peers.png")
    print(text)
    print(f"wrote {out / 'peers.md'}, {out / 'peers.png'} and peers.json")


def _f(x, fmt="{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def markdown(results, meta) -> str:
    v = meta["pcx_versions"]
    ver = (f"PCX {v.get('pcx')}, JAX {v.get('jax')} (jaxlib {v.get('jaxlib')}), equinox {v.get('equinox')}, "
           f"optax {v.get('optax')}" if v else f"PCX not run: {meta['pcx_error'] or '--no-pcx'}")
    peaks = ", ".join(f"{c} core(s) {g:.1f} GFLOP/s" for c, g in sorted(meta["peak_gflops"].items()))
    lines = [
        "# inferlearn vs PCX: predictive coding and back-propagation epoch times", "",
        f"Command: `{meta['command']}` ({meta['date']})", "",
        f"Versions: inferlearn (this commit), torch {meta['torch']}; {ver}; Python {meta['python']}, {meta['machine']}.",
        "", "Setup (see `docs/peers.md`): MNIST from inferlearn's loader, the same initial weights "
        "(inferlearn's, exported), the same batches in the same order, float32, data in memory, for both libraries. "
        "MLP `784-64-64-64-10` and conv net `conv:8-16/64`, ReLU. PC: T = 15 inference steps, value-node SGD step η, "
        f"weight SGD lr; *inferlearn defaults* η = {SETTINGS['inferlearn defaults']['eta']:g}, "
        f"lr = {SETTINGS['inferlearn defaults']['lr']:g}; *PCX setting* η = 0.3, lr = 0.1. BP: quadratic "
        f"loss, SGD lr {BP_LR}. One core = one thread each, both processes pinned to the same core "
        "(`sched_setaffinity`), runs interleaved; two cores = two threads each on two cores.", "",
        "*epoch (s)*: median over repeats of the time to train the timed samples (column *timed*), scaled to 60 000 "
        "samples (one epoch); compilation and evaluation excluded. *compile / warm-up (s)*: JAX's first call "
        "(trace + compile + one batch); for inferlearn its first batch in the process (*inferlearn compiled*, "
        "`--compile on`: the first batch compiles the batch's graph, on the MLP the fused training step: PC's whole "
        "inference — forward pass, T steps, weight gradient — or BP's forward and backward, with the optimiser's update; "
        "on the conv net PC's value-node step and BP's forward and backward pass — or loads "
        "it from inductor's on-disk cache). *floor (s)*: multiply-adds "
        "per epoch × 2 ÷ the measured matmul peak (1024×1024 float32 `torch.mm`, best of all repeats: "
        f"{peaks}; two cores: the better of the one- and two-thread peaks); BP 3F − F₀, PC 2F + 2T(F − F₀) per sample. *test acc*: after the timed samples "
        "(one epoch when *timed* is 60 000), first repeat, one core.", ""]
    for kind in dict.fromkeys(r["model"] for r in results):
        F, F0 = mac_counts(kind)
        lines += [f"## {ARCHS[kind]}", "",
                  f"Forward multiply-adds per sample F = {F:,}, first layer F₀ = {F0:,}: floor ratio PC/BP = "
                  f"{(2 * F + 2 * T * (F - F0)) / (3 * F - F0):.2f}.", "",
                  "| batch | cores | method | library | setting | timed | epoch (s) | compile / warm-up (s) | floor (s) "
                  "| epoch / floor | test acc |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            if r["model"] != kind:
                continue
            epoch = _f(r["epoch_s"]) if r["epoch_s"] else str(r["error"]).replace("|", "/")
            lines.append(f"| {r['batch']} | {r['cores']} | {'PC T=15' if r['method'] == 'pc' else 'BP'} | {r['lib']} | "
                         f"{r['setting']} | {r['samples']:,} | {epoch} | {_f(r['compile_s'])} | {_f(r['floor_s'], '{:.3f}')} | "
                         f"{_f(r['vs_floor'], '{:.1f}')} | {_f(r['test_acc'], '{:.4f}')} |")
        lines.append("")
    lines += ["## Ratios", "", "| model | batch | cores | PC/BP inferlearn | PC/BP PCX vs JAX jit | "
              "inferlearn/PCX (PC) | compiled/PCX (PC) | inferlearn/JAX (BP) | compiled/JAX (BP) |",
              "|---|---|---|---|---|---|---|---|---|"]
    key = {(r["model"], r["batch"], r["cores"], r["method"], r["lib"], r["setting"]): r["epoch_s"] for r in results}
    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "—"

    for (kind, batch, cores) in dict.fromkeys((r["model"], r["batch"], r["cores"]) for r in results):
        def g(method, lib, kind=kind, batch=batch, cores=cores):
            return key.get((kind, batch, cores, method, lib, "PCX setting" if method == "pc" else "—"))
        lines.append(f"| {kind} | {batch} | {cores} | {ratio(g('pc', 'inferlearn'), g('bp', 'inferlearn'))} | "
                     f"{ratio(g('pc', 'PCX'), g('bp', 'JAX jit'))} | {ratio(g('pc', 'inferlearn'), g('pc', 'PCX'))} | "
                     f"{ratio(g('pc', COMPILED), g('pc', 'PCX'))} | {ratio(g('bp', 'inferlearn'), g('bp', 'JAX jit'))} | "
                     f"{ratio(g('bp', COMPILED), g('bp', 'JAX jit'))} |")
    lines += ["", "PC rows at the PCX setting; ratios of the median epoch times above.", ""]
    acc = {(r["model"], r["batch"], r["method"], r["lib"], r["setting"]): r["test_acc"] for r in results
           if r["cores"] == 1 and r["test_acc"] is not None}
    diffs = {m: [abs(a - acc[(k, b, m, other, s)]) for (k, b, mm, lib, s), a in acc.items()
                 if mm == m and lib == "inferlearn" and (k, b, m, other, s) in acc]
             for m, other in (("pc", "PCX"), ("bp", "JAX jit"))}
    if any(diffs.values()):
        lines += [f"Same network, weights, batches and setting: the largest test-accuracy difference between "
                  f"inferlearn and PCX is {_f(max(diffs['pc'], default=None), '{:.4f}')} (PC, "
                  f"{len(diffs['pc'])} pairs), between inferlearn and JAX jit "
                  f"{_f(max(diffs['bp'], default=None), '{:.4f}')} (BP, {len(diffs['bp'])} pairs).", ""]
    return "\n".join(lines)


def overhead_table(rows) -> str:
    if not rows:
        return ""
    lines = ["", "## Fixed cost per batch", "",
             f"The MLP at batch 1 (one core, {rows[0]['batches']} batches, median of the repeats): what a batch costs "
             "beyond its arithmetic — Python and per-operation dispatch (inferlearn runs every tensor operation of "
             "the T-step loop from Python; PCX calls one compiled program per batch through its pytree wrapper) "
             "and the training loop's checks. Compare with the per-batch times at batch 50 (epoch time / 1200).", "",
             "| method | library | setting | ms per batch |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'PC T=15' if r['method'] == 'pc' else 'BP'} | {r['lib']} | {r['setting']} | "
                     f"{_f(r['per_batch_ms'], '{:.2f}')} |")
    return "\n".join(lines) + "\n"


def plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["model"], r["batch"]) for r in results))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.6), squeeze=False)
    colors = {"inferlearn": "tab:blue", COMPILED: "tab:purple", "PCX": "tab:orange", "JAX jit": "tab:green"}
    for ax, (kind, batch) in zip(axes[0], groups):
        rows = [r for r in results if r["model"] == kind and r["batch"] == batch]
        labels = []
        for i, r in enumerate(rows):
            short = {"inferlearn defaults": " (il)", "PCX setting": " (pcx)"}.get(r["setting"], "")
            labels.append(f"{'PC' if r['method'] == 'pc' else 'BP'} {r['lib']}{short} {r['cores']}c")
            if r["epoch_s"]:
                ax.bar(i, r["epoch_s"], color=colors[r["lib"]], alpha=1.0 if r["cores"] == 1 else 0.55,
                       hatch=None if r["cores"] == 1 else "//")
            ax.plot([i - 0.4, i + 0.4], [r["floor_s"]] * 2, color="black", lw=1.5)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{ARCHS[kind]}, batch {batch}", fontsize=9)
        ax.set_ylabel("epoch time (s, log); black line: floor")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=lib) for lib, c in colors.items()] + [
        Patch(facecolor="white", edgecolor="gray", hatch="//", label="two cores")]
    axes[0][0].legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
