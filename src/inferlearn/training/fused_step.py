"""One compiled call per mini-batch on a dense chain: a rule's whole-batch gradient and the optimiser's update.

On a small MLP a back-propagation step is a dozen matrix products and a batch of predictive coding a
few dozen; eager PyTorch spends much of the batch dispatching operations one by one, in the rule and in
the optimiser's ``step``. When compilation is active for whole-batch graphs (:mod:`inferlearn.engine.compiled`:
``--compile on``, or ``auto`` on a CUDA device or for a long CPU run), the training loop replaces
``rule.backward`` + ``optimizer.step`` by one :class:`~inferlearn.engine.compiled.CompiledStep` of
:func:`_fused_update`::

    (loss, ∇θ) = gradient(x, y)                     the rule's plan (engine/fused.py DensePlan): back-propagation's
                                                    fused backward, or predictive coding's whole inference
    θ ← update(θ, ∇θ, optimizer state, lr)          torch.optim's functional SGD / Adam / AdamW

The update is PyTorch's own functional form of the optimiser (``torch.optim.sgd.sgd``,
``torch.optim.adam.adam``), on the optimiser's own state tensors (``momentum_buffer``; ``step``,
``exp_avg``, ``exp_avg_sq``), so checkpoints, resuming and a switch between the two paths see one
optimiser. The learning rate enters as a 0-d tensor: a schedule changes it without recompiling.

It applies where a rule has a ``dense_plan`` for the model (:class:`~inferlearn.rules.backprop.BackProp`,
:class:`~inferlearn.rules.fenchel.FenchelBackProp`, and :class:`~inferlearn.rules.predictive_coding.PredictiveCoding`
with a clamped output, plain steps and no ``tol``, on a dense chain), one parameter group holding exactly the
chain's parameters (all trainable), SGD without dampening or Nesterov momentum, or Adam/AdamW without AMSGrad,
nothing maximised, and a single process (data-parallel runs average the gradients between the backward and
the step). Anything else keeps the two calls. Predictive coding's verdict and warnings are read from the
call's statistics afterwards, as in the separate call. Eager and compiled agree to rounding
(``tests/training/test_fused_step.py``); the speed is measured in ``benchmarks/peers/``.
"""
from __future__ import annotations

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from ..engine.compiled import CompiledStep, compile_mode
from ..engine.fused import DensePlan, pc_inference, bp_step, bp_step_arguments


def _fused_update(x, labels, params, biased, gradient, constants, state, lr, kind, hyper):
    """A rule's whole-batch gradient (:class:`~inferlearn.engine.fused.DensePlan`) and the optimiser's update of
    ``params`` (in place) as one pure function; returns the loss (``"bp"``) or the call's statistics (``"pc"``).

    ``params`` are ``[W_0, b_0, W_1, …]`` (``biased[k]``: layer ``k`` has a bias), ``state`` the optimiser's
    per-parameter tensors, ``hyper`` its constants. The one-hot targets are built here, from labels the
    training loop has checked."""
    Ws, bs, it = [], [], iter(params)
    for has_bias in biased:
        Ws.append(next(it))
        bs.append(next(it) if has_bias else None)
    y = torch.zeros(x.shape[0], Ws[-1].shape[0], dtype=x.dtype, device=x.device).scatter_(1, labels.long()[:, None], 1.0)
    if gradient == "bp":
        value, _, grads = bp_step(x, labels, y, Ws, bs, *constants)
        out = value
    else:
        grads, _, _, s1, sT, summary = pc_inference(x, y, Ws, bs, *constants)
        out = torch.cat([s1, sT, summary])
    grads = [g for (gw, gb), has_bias in zip(grads, biased) for g in ((gw, gb) if has_bias else (gw,))]
    weight_decay = hyper[0]
    if weight_decay and not (kind == "adam" and hyper[-1]):
        # the coupled L2 term added here, not by the functional optimisers: compiled, their
        # ``grad.add(param, alpha=weight_decay)`` came out as ``grad + param`` (torch 2.13, CPU)
        grads = [g + p * weight_decay for g, p in zip(grads, params)]
        weight_decay = 0.0
    if kind == "sgd":
        momentum = hyper[1]
        sgd(params, grads, state[0] if momentum else [None] * len(params), weight_decay=0.0,
            momentum=momentum, lr=lr, dampening=0.0, nesterov=False, maximize=False, foreach=False)
    else:
        _, beta1, beta2, eps, decoupled = hyper
        adam(params, grads, state[0], state[1], [], state[2], foreach=False, decoupled_weight_decay=decoupled,
             amsgrad=False, beta1=beta1, beta2=beta2, lr=lr, weight_decay=weight_decay, eps=eps, maximize=False)
    return out


#: compiled without dynamo's guards: the step's key (shapes, strides, constants) selects the graph, and the call
#: always runs under ``no_grad`` (it saves about 40 µs a batch, ``benchmarks/peers/``)
FUSED_UPDATE = CompiledStep(_fused_update, "the fused training step", whole_batch=True, guards=False)


class FusedTrainStep:
    """``rule.backward`` and ``optimizer.step`` of back-propagation on a dense chain as one call (see the module).

    Build it with :meth:`make` (``None`` where it does not apply); call it with a batch for the loss, only while
    :meth:`active` (compilation on for the batch's device), and the separate calls otherwise.
    """

    def __init__(self, plan: DensePlan, optimizer: torch.optim.Optimizer, kind: str):
        self.plan = plan
        Ws = [link.linear.weight for link in plan.graph.nodes]
        bs = [link.linear.bias for link in plan.graph.nodes]
        if plan.gradient == "bp":   # (loss, local backward) → bp_step's (units, loss, local, its constants)
            loss, local = plan.constants
            _, _, units, func, kw = bp_step_arguments(plan.graph, local)
            self.constants = (units, loss, func, kw)
        else:
            self.constants = plan.constants
        self.optimizer, self.kind, self.group = optimizer, kind, optimizer.param_groups[0]
        self.biased = tuple(b is not None for b in bs)
        self.params = [t for pair in zip(Ws, bs) for t in pair if t is not None]
        # in the parameters' precision (the eager optimiser's Python float lr is a double)
        self._lr = torch.tensor(float(self.group["lr"]), dtype=self.params[0].dtype if self.params else torch.float32)
        self._states: tuple | None = None   # the optimiser's state tensors, looked up on the first call
        self._lr_value = float(self.group["lr"])
        self._runs: dict = {}   # (batch shape, dtype, device, compile mode, hyper-parameters) → what to run

    @classmethod
    def make(cls, rule, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             distributed: bool = False) -> "FusedTrainStep | None":
        """The fused step of ``rule`` on ``model`` with ``optimizer``, or ``None`` where it does not apply."""
        plan = getattr(rule, "dense_plan", None)
        plan = plan(model) if callable(plan) and not distributed else None
        if plan is None or len(optimizer.param_groups) != 1:
            return None
        g = optimizer.param_groups[0]
        if type(optimizer) is torch.optim.SGD and not g["nesterov"] and g["dampening"] == 0 and not g["maximize"]:
            kind = "sgd"
        elif type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not g["amsgrad"] and not g["maximize"] \
                and not torch.is_tensor(g["lr"]) and not any(torch.is_tensor(b) for b in g["betas"]):
            kind = "adam"
        else:
            return None
        step = cls(plan, optimizer, kind)
        if {id(p) for p in step.params} != {id(p) for p in g["params"]} or len(step.params) != len(g["params"]) \
                or not all(p.requires_grad for p in step.params):
            return None
        return step

    def active(self, device: torch.device) -> bool:
        """Whether the step runs compiled on ``device`` (otherwise the loop keeps the separate calls)."""
        return FUSED_UPDATE.active(device)

    def _state(self) -> tuple:
        """The optimiser's per-parameter tensors (created as torch.optim creates them on its first step). Both
        paths update them in place, so they are looked up once: build a new step after loading a state dict."""
        if self._states is None:
            self._states = self._find_state()
        return self._states

    def _find_state(self) -> tuple:
        states = [self.optimizer.state[p] for p in self.params]
        if self.kind == "sgd":
            if not self.group["momentum"]:
                return ()
            for p, st in zip(self.params, states):   # zeros: with dampening 0 the first step gives buf = ∇θ
                if st.get("momentum_buffer") is None:
                    st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            return ([st["momentum_buffer"] for st in states],)
        for p, st in zip(self.params, states):
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif st["step"].device.type != "cpu":   # the functional Adam (not capturable) keeps steps on the CPU
                st["step"] = st["step"].cpu()
        return tuple([st[k] for st in states] for k in ("exp_avg", "exp_avg_sq", "step"))

    def _hyper(self) -> tuple:
        g = self.group
        if self.kind == "sgd":
            return float(g["weight_decay"]), float(g["momentum"])
        return (float(g["weight_decay"]), float(g["betas"][0]), float(g["betas"][1]), float(g["eps"]),
                type(self.optimizer) is torch.optim.AdamW or bool(g.get("decoupled_weight_decay", False)))

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> float:
        """Train on one (validated) batch: the update is applied; returns the batch's loss."""
        for p in self.params:
            p.grad = None
        lr = float(self.group["lr"])
        if lr != self._lr_value:
            self._lr.fill_(lr)
            self._lr_value = lr
        hyper = self._hyper()
        args = (x.reshape(x.shape[0], -1), labels, self.params, self.biased, self.plan.gradient, self.constants,
                self._state(), self._lr, self.kind, hyper)
        # the same call every batch: after the first, run the graph it resolved to without the step's lookup
        key = (x.shape, x.stride(), x.dtype, x.device, labels.shape, labels.stride(), compile_mode(), hyper)
        run = self._runs.get(key)
        if run is None:
            out = FUSED_UPDATE(*args)
            self._runs[key] = FUSED_UPDATE.resolved(*args)
        else:
            out = run(*args)
        # the flag torch.optim's step sets for its schedulers: without it an epoch of fused steps alone makes
        # lr_scheduler.step() warn that the optimiser never stepped
        self.optimizer._opt_called = True
        return float(out) if self.plan.finish is None else self.plan.finish(out.tolist())


__all__ = ["FusedTrainStep", "FUSED_UPDATE"]
