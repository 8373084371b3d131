"""The JAX side of ``bench_pcx_conv.py``: PCX's VGG-5 / VGG-7 CIFAR benchmark (PC and BP), ported minimally.

Runs inside PCX's own virtual environment (never imports inferlearn or torch); one run per process::

    python pcx_conv_worker.py --data run.npz --model vgg5 --width 0.125 --method pc --epochs 5 --seed 0 \
        --T 8 --ce --x-lr 0.0147 --x-momentum 0.05 --w-lr 2.64e-4 --wd 1.2e-5 --act gelu --out result.json

What is PCX's and what is the driver's. The training step is PCX's benchmark code (github.com/liukidar/pcx, commit
``c722834``, ``examples/s4_1_discriminative_mode/PC.py`` and ``BP.py``, ``models.py`` and ``models_BP.py``) in the
API of PCX 0.6.3: value nodes (``Vode``) after each conv block (after its pooling) and at the output, the output
node frozen and set to ``u − β (u − y)`` (β = 1: the label; the nudged recipes' β per epoch from ``--betas``,
PC.py's ``beta`` schedule), ``T`` steps of ``optax.sgd(x_lr, momentum)`` on the
energy *averaged* over the batch (``pmean``, as PCX's code), then ``optax.adamw`` on the weight gradient × 1/β,
the weights' rate on PCX's ``warmup_cosine_decay_schedule`` (from ``lr`` to ``1.1 lr`` over 10 % of the steps,
cosine to ``0.1 lr``); BP: the same network without value nodes, the batch-mean loss (``sum (f − y)²`` or the
cross-entropy), the same optimiser and schedule. As PCX's loader, the last partial batch of an epoch is dropped
(inferlearn trains it: 80 more images an epoch). PCX's own initialisation (equinox's, seeded by ``--seed``). The
data are the driver's (``--data``): inferlearn's standardised arrays, inferlearn's batch order and inferlearn's
crop/flip draws for each epoch, so that both libraries see the same images in the same order.

Writes ``--out``: ``{"test_acc": [per epoch], "epoch_seconds": [per epoch], "compile_s": …, "versions": …}``; the
first step at each β (the first step of the run, and of each epoch whose β is new) compiles and is counted in
``compile_s``, not in the epoch's seconds.
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
    print(f"cannot import PCX/JAX ({exc}); run this worker with the PCX venv's python", file=sys.stderr)
    raise SystemExit(2) from None

#: (channels, padding, 2×2 max pooling after the block) per conv block, as PCX's models.py (full width)
STAGES = {"vgg5": ((128, 1, True), (256, 1, True), (512, 1, True), (512, 1, True)),
          "vgg7": ((128, 1, True), (128, 1, False), (256, 1, True), (256, 0, False), (512, 1, True), (512, 0, False))}
ACTS = {"gelu": jax.nn.gelu, "hard-tanh": jax.nn.hard_tanh, "leaky-relu": jax.nn.leaky_relu, "relu": jax.nn.relu}


def blocks(model: str, width: float, size: int = 32):
    """``[(c_in, c_out, padding, pool, output (C, H, W))]`` and the classifier's input size at ``width``."""
    out, c_in, h = [], 3, size
    for c, pad, pool in STAGES[model]:
        c = max(1, round(c * width))
        h = h + 2 * pad - 2
        h = h // 2 if pool else h
        out.append((c_in, c, pad, pool, (c, h, h)))
        c_in = c
    return out, c_in * h * h


class PCNet(pxc.EnergyModule):
    """PCX's VGG (models.py) at a width: conv → activation [→ max pool] → Vode per block, Linear → output Vode."""

    def __init__(self, model: str, width: float, act, ce: bool, n_classes: int = 10):
        super().__init__()
        spec, n_feat = blocks(model, width)
        self.act_fn = px.static(act)
        self.convs = [pxnn.Conv2d(ci, co, kernel_size=(3, 3), padding=(p, p)) for ci, co, p, _, _ in spec]
        self.pools = px.static(tuple(pool for _, _, _, pool, _ in spec))
        self.pool = pxnn.MaxPool2d(kernel_size=2, stride=2)
        self.fc = pxnn.Linear(n_feat, n_classes)
        self.vodes = [pxc.Vode() for _ in spec] + [pxc.Vode(pxc.ce_energy if ce else pxc.se_energy)]
        self.vodes[-1].h.frozen = True

    def __call__(self, x, y=None, beta: float = 1.0):
        for conv, pool, vode in zip(self.convs, self.pools.get(), self.vodes[:-1]):
            x = self.act_fn(conv(x))
            x = vode(self.pool(x) if pool else x)
        x = self.vodes[-1](self.fc(x.flatten()))
        if y is not None:
            self.vodes[-1].set("h", self.vodes[-1].get("u") - beta * (self.vodes[-1].get("u") - y))
        return self.vodes[-1].get("u")


class BPNet(px.Module):
    """PCX's VGG without value nodes (models_BP.py)."""

    def __init__(self, model: str, width: float, act, n_classes: int = 10):
        super().__init__()
        spec, n_feat = blocks(model, width)
        self.act_fn = px.static(act)
        self.convs = [pxnn.Conv2d(ci, co, kernel_size=(3, 3), padding=(p, p)) for ci, co, p, _, _ in spec]
        self.pools = px.static(tuple(pool for _, _, _, pool, _ in spec))
        self.pool = pxnn.MaxPool2d(kernel_size=2, stride=2)
        self.fc = pxnn.Linear(n_feat, n_classes)

    def __call__(self, x):
        for conv, pool in zip(self.convs, self.pools.get()):
            x = self.act_fn(conv(x))
            x = self.pool(x) if pool else x
        return self.fc(x.flatten())


VMASK = pxu.M(pxc.VodeParam | pxc.VodeParam.Cache).to((None, 0))


@pxf.vmap(VMASK, in_axes=(0, 0, None), out_axes=0)
def pc_forward(x, y, beta=1.0, *, model):
    return model(x, y, beta)   # the output node set to u − β (u − y): the label at β = 1


@pxf.vmap(VMASK, in_axes=(0,), out_axes=(None, 0), axis_name="batch")
def pc_energy(x, *, model):
    y_ = model(x, None)
    return jax.lax.pmean(model.energy().sum(), "batch"), y_   # PCX's code: the batch *mean*


@pxf.jit(static_argnums=(0, 3))   # β static: at β = 1 the step compiles as before nudging was ported (bit for bit)
def pc_train_on_batch(T: int, x, y, beta: float, *, model, optim_w, optim_h):
    model.train()
    with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
        pc_forward(x, y, beta, model=model)
    optim_h.init(pxu.M_hasnot(pxc.VodeParam, frozen=True)(model))
    value_grad = pxf.value_and_grad(pxu.M_hasnot(pxc.VodeParam, frozen=True).to([False, True]), has_aux=True)(pc_energy)
    for _ in range(T):
        with pxu.step(model, clear_params=pxc.VodeParam.Cache):
            _, g = value_grad(x, model=model)
        optim_h.step(model, g["model"])
    optim_h.clear()
    weight_grad = pxf.value_and_grad(pxu.M(pxnn.LayerParam).to([False, True]), has_aux=True)(pc_energy)
    with pxu.step(model, clear_params=pxc.VodeParam.Cache):
        _, g = weight_grad(x, model=model)
    optim_w.step(model, g["model"], scale_by=None if beta == 1.0 else 1.0 / beta)   # PC.py: the weight gradient × 1/β


@pxf.jit()
def pc_predict(x, *, model):
    model.eval()
    with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
        out = pc_forward(x, None, 1.0, model=model)
    return out.argmax(-1)


@pxf.vmap({"model": None}, in_axes=0, out_axes=0)
def bp_forward(x, *, model):
    return model(x)


def make_bp_loss(ce: bool):
    @pxf.vmap({"model": None}, in_axes=(0, 0), out_axes=(None, 0), axis_name="batch")
    def loss(x, y, *, model):
        y_ = model(x)
        per = -(y * jax.nn.log_softmax(y_)).sum() if ce else jnp.square(y_ - y).sum()   # BP.py's ce_loss / se_loss
        return jax.lax.pmean(per, "batch"), y_
    return loss


def augment(x: np.ndarray, fill: np.ndarray, dy: np.ndarray, dx: np.ndarray, flip: np.ndarray, pad: int = 4):
    """inferlearn's ``CropFlip.apply`` in numpy: crop each image at ``(dy, dx)`` of its ``pad``-padded copy (padded with
    the per-channel ``fill``), mirrored left-right where ``flip``."""
    n, c, h, w = x.shape
    padded = np.broadcast_to(fill[None, :, None, None], (n, c, h + 2 * pad, w + 2 * pad)).copy()
    padded[:, :, pad:pad + h, pad:pad + w] = x
    rows = dy[:, None] + np.arange(h)
    cols = dx[:, None] + np.arange(w)
    cols = np.where(flip[:, None], cols[:, ::-1], cols)
    k = np.arange(n)[:, None, None]
    return padded.transpose(0, 2, 3, 1)[k, rows[:, :, None], cols[:, None, :]].transpose(0, 3, 1, 2)


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("pcx", "jax", "jaxlib", "equinox", "optax")} | {
        "python": sys.version.split()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description="PCX's VGG CIFAR benchmark, one run (worker of bench_pcx_conv.py)")
    p.add_argument("--data", required=True)
    p.add_argument("--model", choices=sorted(STAGES), required=True)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--method", choices=("pc", "bp"), required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--T", type=int, default=8)
    p.add_argument("--ce", action="store_true")
    p.add_argument("--x-lr", type=float, default=0.0)
    p.add_argument("--x-momentum", type=float, default=0.0)
    p.add_argument("--w-lr", type=float, required=True)
    p.add_argument("--wd", type=float, required=True)
    p.add_argument("--act", choices=sorted(ACTS), required=True)
    p.add_argument("--betas", default="1", help="β per epoch, comma-separated (the last repeats; 1: the label)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=0, help="time only this many steps per epoch, without evaluating "
                   "(0: whole epochs, evaluated; time_pcx_conv.py's timing)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    d = np.load(a.data)
    train_x, train_y = d["train_x"].astype(np.float32), d["train_y"].astype(np.int64)
    test_x, test_y = d["test_x"].astype(np.float32), d["test_y"].astype(np.int64)
    fill = d["fill"].astype(np.float32)
    n = train_x.shape[0]
    epoch_steps = n // a.batch   # PCX's loader drops the last, partial batch (drop_last=True): 390 on CIFAR-10
    steps = min(a.steps, epoch_steps) if a.steps else epoch_steps
    px.RKG.seed(a.seed)
    act = ACTS[a.act]
    schedule = optax.warmup_cosine_decay_schedule(init_value=a.w_lr, peak_value=1.1 * a.w_lr,
                                                  warmup_steps=0.1 * epoch_steps * a.epochs,
                                                  decay_steps=epoch_steps * a.epochs,
                                                  end_value=0.1 * a.w_lr, exponent=1.0)
    if a.method == "pc":
        model = PCNet(a.model, a.width, act, a.ce)
        with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):   # shape the value nodes
            pc_forward(jnp.zeros((a.batch,) + train_x.shape[1:]), None, 1.0, model=model)
        optim_h = pxu.Optim(lambda: optax.sgd(a.x_lr, momentum=a.x_momentum))
        optim_w = pxu.Optim(lambda: optax.adamw(schedule, weight_decay=a.wd), pxu.M(pxnn.LayerParam)(model))

        def train_step(x, y):
            pc_train_on_batch(a.T, x, y, beta, model=model, optim_w=optim_w, optim_h=optim_h)

        def predict(x):
            return pc_predict(x, model=model)
    else:
        model = BPNet(a.model, a.width, act)
        optim_w = pxu.Optim(lambda: optax.adamw(schedule, weight_decay=a.wd), pxu.M(pxnn.LayerParam)(model))
        loss = make_bp_loss(a.ce)

        @pxf.jit()
        def bp_step(x, y, *, model, optim_w):
            model.train()
            with pxu.step(model):
                _, g = pxf.value_and_grad(pxu.M(pxnn.LayerParam).to([False, True]), has_aux=True)(loss)(x, y, model=model)
            optim_w.step(model, g["model"])

        @pxf.jit()
        def bp_predict(x, *, model):
            model.eval()
            with pxu.step(model):
                return bp_forward(x, model=model).argmax(-1)

        def train_step(x, y):
            bp_step(x, y, model=model, optim_w=optim_w)

        def predict(x):
            return bp_predict(x, model=model)

    eye = np.eye(10, dtype=np.float32)
    accs, seconds, compile_s, compiled = [], [], None, set()
    betas = [float(b) for b in a.betas.split(",")]
    for epoch in range(1, a.epochs + 1):
        beta = betas[min(epoch, len(betas)) - 1]
        order = d[f"order_{epoch}"]
        dy, dx, flip = d[f"dy_{epoch}"], d[f"dx_{epoch}"], d[f"flip_{epoch}"].astype(bool)
        t0, excluded = time.perf_counter(), 0.0
        for s in range(steps):
            idx = order[s * a.batch:(s + 1) * a.batch]
            rows = slice(s * a.batch, s * a.batch + len(idx))
            x = augment(train_x[idx], fill, dy[rows], dx[rows], flip[rows])
            t1 = time.perf_counter()
            train_step(jnp.asarray(x), jnp.asarray(eye[train_y[idx]]))
            if beta not in compiled:   # the first step at each β compiles (β is static): counted in compile_s
                compiled.add(beta)
                jax.block_until_ready(jax.tree_util.tree_leaves(model))
                excluded += time.perf_counter() - t1
                compile_s = (compile_s or 0.0) + time.perf_counter() - t1
        jax.block_until_ready(jax.tree_util.tree_leaves(model))
        seconds.append(time.perf_counter() - t0 - excluded)
        if a.steps:   # timing only: epoch 1's seconds cover steps − 1 steps (the first is in compile_s)
            continue
        if a.method == "pc":
            model.clear_params(pxc.VodeParam)
        pred = np.concatenate([np.asarray(predict(jnp.asarray(test_x[i:i + 1000])))
                               for i in range(0, test_x.shape[0], 1000)])
        if a.method == "pc":   # back to value nodes shaped for the training batch
            model.clear_params(pxc.VodeParam)
            with pxu.step(model, (pxc.STATUS.INIT, None), clear_params=pxc.VodeParam.Cache):
                pc_forward(jnp.zeros((a.batch,) + train_x.shape[1:]), None, 1.0, model=model)
        accs.append(float((pred == test_y).mean()))
        print(f"epoch {epoch}: test {accs[-1]:.4f}, {seconds[-1]:.1f} s", file=sys.stderr, flush=True)
    with open(a.out, "w") as f:
        json.dump({"test_acc": accs, "epoch_seconds": seconds, "compile_s": compile_s, "versions": versions(),
                   "args": vars(a)}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
