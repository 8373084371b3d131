"""The JAX side of ``bench_pcx.py``: predictive coding with PCX and back-propagation with plain ``jax.jit``.

Runs inside PCX's own virtual environment (never imports inferlearn or torch). ``bench_pcx.py`` starts it
pinned to the same core(s) as itself, with one XLA thread, and talks to it over stdin/stdout, one JSON
object per line, so that its runs interleave with inferlearn's:

    -> {"op": "run", "model": "mlp"|"conv", "method": "pc"|"bp", "batch": 50, "batches": 300,
        "steps": 15, "eta": 0.3, "lr": 0.1, "evaluate": true}
    <- {"ok": true, "seconds": ..., "compile_s": ... or null, "test_acc": ... or null}
    -> {"op": "quit"}

The data file (``--data``, written by ``bench_pcx.py``) holds the inferlearn loader's MNIST arrays,
the batch order inferlearn's training loop uses, and inferlearn's initial weights of both models (torch
layouts: Linear ``(out, in)``, Conv ``(out, in, 3, 3)``), so that both libraries train the same network from
the same weights on the same batches.

Predictive coding (PCX's discriminative setting): value nodes after each unit, the output node clamped to
the one-hot label with the squared-error energy, ``T`` value-node steps of ``optax.sgd(eta)`` on the energy
summed over the batch, then one weight step of ``optax.sgd(lr)`` on the energy's weight gradient scaled by
``1/B``. Back-propagation: the same network, the batch-mean quadratic loss ``½‖f(x) − y‖²``, plain SGD.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    import optax
    import pcx as px
    import pcx.functional as pxf
    import pcx.nn as pxnn
    import pcx.predictive_coding as pxc
    import pcx.utils as pxu
except ImportError as exc:   # run with the wrong interpreter
    print(json.dumps({"ok": False, "error": f"cannot import PCX/JAX ({exc}); run this worker with the PCX venv's python"}),
          flush=True)
    raise SystemExit(2) from None

IMAGE = (1, 28, 28)


# ----------------------------------------------------------------------------------------------------------------
# Predictive coding networks (PCX)


class PCNet(pxc.EnergyModule):
    """784-…-10 MLP or the conv net ``conv:C1-C2/H`` of ``inferlearn.models.conv_net``, one vode per hidden layer.

    Layer ``k`` maps the previous value node (average-pooled first when it is a conv stage's output) and
    applies ReLU, except the linear output layer. The output vode is frozen and clamped to the label.
    """

    def __init__(self, kind: str, weights: list[tuple[np.ndarray, np.ndarray]]):
        super().__init__()
        self.kind = px.static(kind)
        layers = []
        for w, _ in weights:
            if w.ndim == 4:
                layer = pxnn.Conv2d(w.shape[1], w.shape[0], 3, padding=1)
            else:
                layer = pxnn.Linear(w.shape[1], w.shape[0])
            layers.append(layer)
        self.layers = layers
        self.n_conv = px.static(sum(1 for w, _ in weights if w.ndim == 4))
        self.pool = pxnn.AvgPool2d(2, 2)
        self.vodes = [pxc.Vode() for _ in weights[:-1]] + [pxc.Vode(pxc.se_energy)]
        self.vodes[-1].h.frozen = True
        self.load(weights)

    def load(self, weights) -> None:
        """Set the layer parameters to the given (torch-layout) arrays."""
        for layer, (w, b) in zip(self.layers, weights):
            layer.nn.weight.set(jnp.asarray(w))
            layer.nn.bias.set(jnp.asarray(b).reshape(layer.nn.bias.get().shape))

    def __call__(self, x, y=None):
        n_conv, z = self.n_conv.get(), x
        if n_conv:
            z = z.reshape(IMAGE)
        for k, (layer, vode) in enumerate(zip(self.layers[:-1], self.vodes[:-1])):
            if 0 < k <= n_conv:           # the pooling belongs to the next layer map
                z = self.pool(z)
            if k == n_conv and n_conv:
                z = z.reshape(-1)
            z = vode(jax.nn.relu(layer(z)))
        if len(self.layers) - 1 == n_conv and n_conv:   # (no dense hidden layer)
            z = self.pool(z).reshape(-1)
        out = self.vodes[-1](self.layers[-1](z))
        if y is not None:
            self.vodes[-1].set("h", y)    # clamp the output node (PCX's nudging with beta = 1)
        return out


VMASK = pxu.M(pxc.VodeParam | pxc.VodeParam.Cache).to((None, 0))


@pxf.vmap(VMASK, in_axes=(0, 0), out_axes=0)
def _forward_clamped(x, y, *, model):
    return model(x, y)


@pxf.vmap(VMASK, in_axes=(0,), out_axes=(None, 0), axis_name="batch")
def _energy(x, *, model):
    out = model(x)
    return jax.lax.psum(model.energy(), "batch"), out


@pxf.jit(static_argnums=0)
def pc_train_step(steps: int, x, y, *, model, optim_w, optim_h):
    model.train()
    with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
        _forward_clamped(x, y, model=model)                       # value nodes from the forward pass
    optim_h.init(pxu.M_hasnot(pxc.VodeParam, frozen=True)(model))
    value_grad = pxf.value_and_grad(pxu.M_hasnot(pxc.VodeParam, frozen=True).to([False, True]), has_aux=True)(_energy)
    for _ in range(steps):                                        # T inference steps
        with pxu.step(model, clear_params=pxc.VodeParam.Cache):
            _, g = value_grad(x, model=model)
        optim_h.step(model, g["model"])
    optim_h.clear()
    weight_grad = pxf.value_and_grad(pxu.M(pxnn.LayerParam).to([False, True]), has_aux=True)(_energy)
    with pxu.step(model, clear_params=pxc.VodeParam.Cache):    # weights at the inferred value nodes
        _, g = weight_grad(x, model=model)
    optim_w.step(model, g["model"], scale_by=1.0 / x.shape[0])


@pxf.jit()
def pc_predict(x, *, model):
    model.eval()
    with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
        out = _forward_clamped(x, None, model=model)
    return out.argmax(-1)


class PCRunner:
    def __init__(self, kind, weights, batch, steps, eta, lr):
        self.weights, self.batch, self.steps = weights, batch, steps
        self.model = PCNet(kind, weights)
        self._shape_vodes()
        self.optim_h = pxu.Optim(lambda: optax.sgd(eta))
        self.optim_w = pxu.Optim(lambda: optax.sgd(lr), pxu.M(pxnn.LayerParam)(self.model))

    def _shape_vodes(self):
        """Value nodes sized for the training batch (a forward pass in the INIT status, as PCX's examples do)."""
        self.model.clear_params(pxc.VodeParam)
        with pxu.step(self.model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
            _forward_clamped(jnp.zeros((self.batch, 784), jnp.float32), None, model=self.model)

    def reset(self):
        # The model object is kept (a new one, or a new optimiser, changes jit's static arguments and recompiles):
        # only its values go back to the initial ones. Plain SGD keeps no optimiser state to reset.
        self.model.load(self.weights)
        self._shape_vodes()

    def step(self, x, y):
        pc_train_step(self.steps, x, y, model=self.model, optim_w=self.optim_w, optim_h=self.optim_h)

    def block(self):
        jax.block_until_ready([l.nn.weight.get() for l in self.model.layers])

    def predict(self, x):
        self.model.clear_params(pxc.VodeParam)   # value nodes sized for the training batch; predict() resizes them
        return pc_predict(x, model=self.model)


# ----------------------------------------------------------------------------------------------------------------
# Back-propagation (plain JAX, jit)


def bp_apply(params, x):
    n_conv = sum(1 for w, _ in params if w.ndim == 4)
    z = x.reshape((x.shape[0],) + IMAGE) if n_conv else x
    for k, (w, b) in enumerate(params):
        if 0 < k <= n_conv:
            B, C, H, W = z.shape
            z = z.reshape(B, C, H // 2, 2, W // 2, 2).mean(axis=(3, 5))
        if k == n_conv and n_conv:
            z = z.reshape(z.shape[0], -1)
        if w.ndim == 4:
            z = jax.lax.conv_general_dilated(z, w, (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=("NCHW", "OIHW", "NCHW")) + b[None, :, None, None]
        else:
            z = z @ w.T + b
        if k < len(params) - 1:
            z = jax.nn.relu(z)
    return z


def bp_loss(params, x, y):
    return 0.5 * jnp.sum((bp_apply(params, x) - y) ** 2) / x.shape[0]


class BPRunner:
    def __init__(self, kind, weights, batch, lr):
        self.weights = weights
        self.params = None

        @jax.jit
        def step(params, x, y):
            g = jax.grad(bp_loss)(params, x, y)
            return jax.tree_util.tree_map(lambda p, d: p - lr * d, params, g)

        self._step = step
        self._predict = jax.jit(lambda params, x: bp_apply(params, x).argmax(-1))
        self.reset()

    def reset(self):
        self.params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in self.weights]

    def step(self, x, y):
        self.params = self._step(self.params, x, y)

    def block(self):
        jax.block_until_ready(self.params)

    def predict(self, x):
        return self._predict(self.params, x)


# ----------------------------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, data_path: str):
        d = np.load(data_path)
        self.train_x = d["train_x"].astype(np.float32)
        self.train_y = d["train_y"].astype(np.int64)
        self.orders = {int(k[6:]): d[k].astype(np.int64) for k in d.files if k.startswith("order_")}
        self.test_x = jnp.asarray(d["test_x"].astype(np.float32))
        self.test_y = np.asarray(d["test_y"]).astype(np.int64)
        self.weights = {}
        for kind in ("mlp", "conv"):
            n = int(d[f"{kind}_layers"])
            self.weights[kind] = [(d[f"{kind}_w{k}"].astype(np.float32), d[f"{kind}_b{k}"].astype(np.float32))
                                  for k in range(n)]
        self.runners: dict = {}
        self.batches: dict = {}

    def data(self, batch: int, n_batches: int):
        """The batches inferlearn's loop draws (same order, same samples), as device arrays."""
        key = (batch, n_batches)
        if key not in self.batches:
            n = batch * n_batches
            if n not in self.orders:
                raise ValueError(f"the data file has no batch order for {n} samples")
            idx = self.orders[n]
            xs = self.train_x[idx].reshape(n_batches, batch, -1)
            ys = np.eye(10, dtype=np.float32)[self.train_y[idx]].reshape(n_batches, batch, 10)
            xs, ys = jnp.asarray(xs), jnp.asarray(ys)
            self.batches = {key: ([xs[i] for i in range(n_batches)], [ys[i] for i in range(n_batches)])}
        return self.batches[key]

    def run(self, cmd: dict) -> dict:
        kind, method, batch, n = cmd["model"], cmd["method"], int(cmd["batch"]), int(cmd["batches"])
        key = (kind, method, batch, cmd.get("steps"), cmd.get("eta"), cmd["lr"])
        xs, ys = self.data(batch, n)
        compile_s = None
        runner = self.runners.get(key)
        if runner is None:
            if method == "pc":
                runner = PCRunner(kind, self.weights[kind], batch, int(cmd["steps"]), float(cmd["eta"]), float(cmd["lr"]))
            else:
                runner = BPRunner(kind, self.weights[kind], batch, float(cmd["lr"]))
            t0 = time.perf_counter()         # first call: trace + compile + one batch
            runner.step(xs[0], ys[0])
            runner.block()
            compile_s = time.perf_counter() - t0
            self.runners[key] = runner
        runner.reset()
        runner.block()
        t0 = time.perf_counter()
        for x, y in zip(xs, ys):
            runner.step(x, y)
        runner.block()
        seconds = time.perf_counter() - t0
        acc = None
        if cmd.get("evaluate"):
            pred = np.concatenate([np.asarray(runner.predict(self.test_x[i:i + 1000]))
                                   for i in range(0, self.test_x.shape[0], 1000)])
            acc = float((pred == self.test_y).mean())
            if method == "pc":
                runner.reset()               # back to training-batch shaped value nodes (no recompile next time)
        return {"ok": True, "seconds": seconds, "compile_s": compile_s, "test_acc": acc}


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("pcx", "jax", "jaxlib", "equinox", "optax")} | {
        "python": sys.version.split()[0], "xla_flags": __import__("os").environ.get("XLA_FLAGS", "")}


def main() -> int:
    p = argparse.ArgumentParser(description="PCX / JAX worker of bench_pcx.py (JSON lines on stdin/stdout)")
    p.add_argument("--data", required=True)
    args = p.parse_args()
    worker = Worker(args.data)
    print(json.dumps({"ok": True, "ready": True, "versions": versions(), "devices": [str(d) for d in jax.devices()]}),
          flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            break
        try:
            reply = worker.run(cmd)
        except Exception as exc:  # reported to the driver, which prints it on one line (traceback on stderr)
            import traceback

            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
