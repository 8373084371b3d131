"""The penalty (predictive-coding) energy's value-node gradients on any graph, as one function of tensors that
:data:`PC_GRAPH_STEP` can compile, and the float64 pre-activations of the weight gradients."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..compiled import CompiledStep
from ..graph import JointEdge, Node
from .layered_energy import cross_entropy_gradient


def penalty_gradients(links: Sequence[Node], x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor,
                      hidden: list[torch.Tensor], weights: tuple[float, ...], output: str, errors: bool
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``∂E/∂z_k`` of the penalty energy with a clamped output, for any maps (conv, pooling, a graph's sums), by
    one vector–Jacobian product through the predictions instead of autograd of the energy's value::

        ∂E/∂z_k = w_k ε_k + Σ_{c reads k} J_{p_c}(z_k)ᵀ g_c,   ε_k = z_k − p_k,  p_c = f_c(a_c(z)),
        g_c = −w_c ε_c (hidden c),  g_L = w_L ∂T_L/∂p_L at the clamped target ``t``: ``p_L − t`` (squared error)
        or ``softmax(p_L) Σ_j t_j − t`` (``output="ce"``)

    The same gradient as autograd of the energy's value (the squared terms' backward is done by hand:
    ``∂½‖z − p‖²/∂p = −ε``), without building and differentiating the terms, and in the value nodes' own memory
    layout. A pure function of tensors and constants (``links``: the graph's nodes, ``p1 = f_1(a_1)``, which no
    value node changes; ``weights``: ``w_0 … w_L``), so that :data:`PC_GRAPH_STEP` can compile it. Returns the
    gradients and, with ``errors``, the norms ``‖ε_k‖`` (0-d tensors; else an empty list)."""
    L = len(links)
    with torch.enable_grad():
        hs = [h.detach().requires_grad_(True) for h in hidden]
        zs = [x, *hs]
        preds = [links[k - 1].act(links[k - 1].pre(zs)) for k in range(2, L + 1)]
    own = [hidden[0] - p1] + [z - p.detach() for z, p in zip(hidden[1:], preds)]
    norms = list(torch._foreach_norm(own)) if errors and len(hidden) == L - 1 else []
    sent = [own[c - 1].mul(-weights[c]) for c in range(2, len(hidden) + 1)]
    if len(hidden) == L - 1:
        p_top = preds[-1].detach()
        d_top = cross_entropy_gradient(p_top, target) if output == "ce" else p_top - target
        sent.append(d_top.mul_(weights[L]))
    back = torch.autograd.grad(preds, hs, sent, allow_unused=True)
    grads = [d.mul(weights[k]) if b is None else b.add_(d, alpha=weights[k])
             for k, (d, b) in enumerate(zip(own, back), start=1)]
    return grads, norms


def _penalty_step(links: Sequence[Node], x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor,
                  hidden: list[torch.Tensor], eta: float, weights: tuple[float, ...], output: str, errors: bool
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One simultaneous step ``z_k ← z_k − η ∂E/∂z_k`` of the clamped penalty energy on any graph
    (:func:`penalty_gradients`; the penalty variables are unconstrained): the new value nodes and the norms."""
    grads, norms = penalty_gradients(links, x, p1, target, hidden, weights, output, errors)
    return [z.sub(g, alpha=eta) for z, g in zip(hidden, grads)], norms


#: ``auto`` compiles a graph's predictive-coding step on CPU for runs of at least this many mini-batches, and
#: keeps it where it measures faster than eager on the step's first calls: compiled, the step took 0.54 and 0.62
#: of eager's time on the conv net and ResNet-20 but 1.06 on VGG-5, for 16-23 s of compiling
#: (``benchmarks/bench_graph_compile.py``)
GRAPH_AUTO_CPU_MIN_BATCHES = 500
#: Predictive coding's value-node step on a graph (conv nets, residual networks, any model the engine reads) as one
#: compiled call: forward predictions, their vector–Jacobian product (traced into the graph) and the update.
#: Used by :meth:`LayeredProblem.gradient_step` for the clamped penalty energy of every model but dense chains (whose
#: closed-form and whole-batch paths are faster), when compilation is active for it.
PC_GRAPH_STEP = CompiledStep(_penalty_step, "the predictive-coding step of a graph",
                             auto_cpu_min_batches=GRAPH_AUTO_CPU_MIN_BATCHES, autograd=True, measure=True)


def pre_float64(link: Node, zs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``a_k = Σ_e A_e(z_{source(e)})`` in float64 through float64 copies of the maps' parameters (and buffers); a
    joint edge ``g(z_{p1}, …)`` as one call of its function.

    Returns the output and the ``(parameter, float64 leaf)`` pairs of the trainable parameters.
    """
    leaves, a = [], None
    for edge in link.edges:
        if isinstance(edge, JointEdge):
            z = _call_float64(edge.fn, [zs[s].double() for s in edge.sources], leaves)
        else:
            z = zs[edge.source].double()
            for m in edge.maps:
                z = _call_float64(m, [z], leaves)
        a = z if a is None else a + z
    return a, leaves


def _call_float64(m: torch.nn.Module, inputs: list[torch.Tensor], leaves: list) -> torch.Tensor:
    """``m(*inputs)`` with float64 copies of its parameters and buffers (the trainable ones appended to ``leaves``)."""
    state = {n: b.double() if b.is_floating_point() else b for n, b in m.named_buffers()}
    for n, p in m.named_parameters():
        q = p.detach().double().requires_grad_(p.requires_grad)
        state[n] = q
        if p.requires_grad:
            leaves.append((p, q))
    return torch.func.functional_call(m, state, tuple(inputs))
