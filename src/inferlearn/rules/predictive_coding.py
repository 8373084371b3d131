"""Predictive coding: clamp the output, infer by ``T`` gradient steps on the penalty energy, read off the weights.

Phase structure "one clamped phase" (docs/maths.md §B taxonomy). The penalty energy of the model's chain
(:mod:`inferlearn.engine.problems`, kind ``penalty``)::

    F(z) = Σ_{k<L} ½‖z_k − f_k(a_k)‖² + (π/2)‖y − f_L(a_L)‖²,   a_k = A_k(z_{k-1}),  z_L := y

with value nodes ``z_k`` started from the forward pass, ``T`` simultaneous gradient steps of size ``η``
(:class:`~inferlearn.engine.solvers.GradientSteps`; defaults T = 20, η = 0.1, chosen on validation
splits by ``benchmarks/tune_defaults.py``), and the envelope gradient
``∇_θ F / (Bπ)`` at the inferred ``z``. Any differentiable layer map (conv, max pooling, normalisation
in eval mode) and any element-wise activation are accepted; dense chains use the fused loop of
:func:`~inferlearn.engine.fused.dense_predictive_coding` (tested equal).

With the output error small the equilibrium errors are back-propagation's deltas and the gradient is
back-propagation's (Whittington & Bogacz 2017): exactly in the limit ``π → 0`` (weak clamping, tested);
with the usual hard clamp ``π = 1`` the hidden errors are ``(I + WᵀW)^{-1}``-filtered versions of
back-propagation's deltas. Run to convergence this is also the penalty form of MAC (auxiliary
coordinates with a quadratic penalty, weights updated at the minimiser), restarted on every batch.

PCX's benchmark recipes are options (Pinchetti et al. 2024): the cross-entropy output energy (``output="ce"``),
momentum or Adam on the value nodes (``inference_optimizer``), a free output nudged by ``±βℓ`` instead of the
clamp (``nudging``), and incremental PC with the weights moved at every inference step (``weight_step``).

References:
    Whittington & Bogacz (2017); Song et al. (2020); Pinchetti et al. (2024), PCX; Salvatori et al. (2024),
    iPC; Scellier & Bengio (2017), nudging; Carreira-Perpiñán & Wang (2014), MAC; Zach, "Bilevel programs meet
    deep learning", Table 1 (PCN row).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, fields

import torch
from torch import nn

from ..engine.graph import COUPLED, NORM_TYPES, Graph, read_graph
from ..engine.fused import DensePlan, accumulate_dense_grads, dense_predictive_coding, pc_batch_stats, pc_constants
from ..engine.problems import OUTPUTS, LayeredEnergy, LayeredProblem, NudgedOutputProblem
from ..engine.phases import NUDGINGS, check_beta, nudged_phases
from ..engine.solvers import EQUILIBRIUM_STEPS, GradientSteps, OptimizerSteps, residual_floor
from ..errors import NonFiniteError
from ..losses import one_hot, quadratic_loss
from ..tensors import all_finite
from .base import Rule, StepInfo, check_positive, register_rule
from .energy_rule import check_engine


def penalty_energy(chain: Graph, output_weight: float, output: str = "se") -> LayeredEnergy:
    """``F(z) = Σ_{k<L} ½‖z_k − f_k(a_k)‖² + (π/2)‖z_L − f_L(a_L)‖²``: hidden terms weight 1, the output ``π``
    (``output="ce"``: ``π CE(z_L, softmax(f_L(a_L)))`` at the top)."""
    return LayeredEnergy(chain, "penalty", [1.0] * (chain.depth - 1) + [output_weight], output=output)


def check_inference_finite(name: str, chain: Graph, hidden, steps: int, step_size: float) -> None:
    """Raise :class:`ConvergenceError` when gradient-step inference left non-finite value nodes or gradients."""
    grads = [p.grad for link in chain.nodes for p in link.parameters() if p.grad is not None]
    if not all_finite(list(hidden) + grads):
        raise NonFiniteError(f"{name}: inference diverged (non-finite value nodes after {steps} steps); "
                               f"lower step_size (now {step_size:g})")


@register_rule
@dataclass
class PredictiveCoding(Rule):
    """Predictive coding: penalty energy, clamped output, ``T`` inference steps, weights at the end.

    Args:
        steps: inference steps ``T`` (20; PCX's benchmark setting is 15, which scored 0.003 lower on the
            validation splits, at η = 0.2, for 3/4 of the cost).
        step_size: the inference rate ``η`` (0.1; ``< 2``, since each value node's own term gives ``F`` a
            curvature of at least 1 for box units). Inference is stable only while ``η`` times the largest
            curvature of ``F`` (which grows with the weights) stays below 2: with SGD 0.4, ``η = 0.2``
            diverged in the third epoch on Fashion-MNIST and ``η ≥ 0.3`` fell apart within the first
            (``benchmarks/results/tuning/pc.md``, ``longer.md``).
        tol: stop early when the largest step is ``≤ tol`` (checked every 5 steps; warns when
            ``steps`` run out first); ``None``: exactly ``steps`` steps.
        output_weight: the precision ``π`` of the output term; the gradient is divided by ``π``.
        output: the output energy: ``"se"``, the squared error ``(π/2)‖y − f_L(a_L)‖²``, or ``"ce"``, the
            cross-entropy ``π CE(y, softmax(a_L)) = −π Σ_j y_j log softmax(a_L)_j`` (PCX's benchmark energy for
            classification, Pinchetti et al. 2024), so that the output error sent down is ``π (y − softmax(a_L))``
            instead of ``π (y − a_L)``: the network's output is the logits.
        inference_optimizer: the update of the value nodes: ``"sgd"``, the plain steps ``z ← z − η ∂F/∂z``;
            ``"momentum"`` (heavy ball, ``torch.optim.SGD``'s) or ``"adam"`` (``torch.optim.Adam``'s), PCX's optax
            optimisers on the value nodes, with learning rate ``step_size`` and a fresh state on every batch
            (:class:`~inferlearn.engine.solvers.OptimizerSteps`, on the generic engine; its convergence checks measure
            ``η max|∂F/∂z|``, the plain step at the point, instead of the optimiser's step).
        inference_momentum: the momentum ``μ`` (``"momentum"``) or Adam's ``β₁`` (0.9; Adam's ``β₂ = 0.999``,
            ``ε = 1e-8``); refused with the plain steps, which would ignore it (as is ``beta`` with the clamp).
        nudging: ``"clamp"`` (the output clamped to the target, standard PC) or PCX's nudged variants, where the
            output node ``z_L`` is a free value node (started at ``a_L``) with the loss ``± β ℓ(z_L)`` added
            (``ℓ = ½‖z_L − y‖²``, or ``CE(y, softmax(z_L))`` with ``output="ce"``; the output node's own term stays
            ``(π/2)‖z_L − a_L‖²``): ``"positive"`` ``∇θ = ∇θF(ẑ₊)/β``, ``"negative"`` ``−∇θF(ẑ₋)/β``,
            ``"symmetric"`` (centred) ``[∇θF(ẑ₊) − ∇θF(ẑ₋)]/(2β)``, all divided by ``B``. The free phase needs no
            solve: without the nudge the equilibrium is the forward pass, where every term of ``F`` and
            ``∇θF`` vanish. Hence the limit: at equilibrium, as ``β → 0`` the gradient is back-propagation's of
            ``ℓ`` (exactly, unlike the clamp's ``(I + WᵀW)^{-1}`` filtering), with error O(β) one-sided and
            O(β²) centred (equilibrium propagation on the penalty energy, Scellier & Bengio 2017). Generic engine
            (:class:`~inferlearn.engine.problems.NudgedOutputProblem`).
            ``"target"``: PCX's output value node (its benchmark code, ``models.py``): the output clamped to the
            target ``t = u₀ + β (y − u₀)`` between the forward pass's output ``u₀`` and the label, and the weight
            gradient ``∇θF(ẑ)/(Bπβ)``; ``β = 1`` is the clamp, ``0 < β < 1`` positive and ``−1 ≤ β < 0`` negative
            nudging (PCX's PC-PN and PC-NN recipes). For small ``β`` the output error is ``β (y − u₀)``, so the
            gradient is the clamp's at a weak clamp, and its limit back-propagation's (Whittington & Bogacz 2017).
        beta: the nudging strength ``β > 0`` (0.1; read only when nudging; ``nudging="target"``: ``β ∈ [−1, 1]``,
            not 0).
        beta_schedule: ``nudging="target"`` only: β per epoch, comma-separated (``"0.9,-0.9,0.9"``: epoch 1 at 0.9,
            epoch 2 at −0.9, …, the last value for every later epoch), PCX's ``beta_ir`` ramps and centred
            nudging's sign list (``hps/…_PC-CN_…_beta.json``); ``None``: ``beta`` throughout.
        weight_step: incremental predictive coding (iPC, Salvatori et al. 2024) when set: the weight learning rate
            ``α`` with which the weights move at *every* inference step. The contract (a rule fills ``.grad`` and
            never steps) is kept by working weights: each step ``t = 1 … T`` updates the value nodes at the current
            weights, ``z_t = z_{t-1} − η ∂F/∂z (z_{t-1}, θ_{t-1})``, then the weights,
            ``θ_t = θ_0 − α S_t``, ``S_t = Σ_{s≤t} g_s``, ``g_s = ∇θF(z_s, θ_{s-1}) / (Bπ)`` (Algorithm 1's order:
            value nodes, then weights); at the end the model's parameters are restored to ``θ_0`` (bit for bit) and
            ``S_T`` is accumulated into ``.grad``, so that one plain SGD step of rate ``α`` (no momentum, no weight
            decay) moves the weights to iPC's ``θ_T``. As ``α → 0`` this is PC's gradient summed along its
            trajectory. Plain steps, clamped output, generic engine; ``None`` (default): standard PC.
        engine: ``auto`` (fused for dense chains with the plain steps and the clamp), ``fused`` or ``generic``.

    Convergence: every batch checks the first and the last step
    (:class:`~inferlearn.engine.solvers.GradientSteps`; their cost is within the measurement noise,
    ``benchmarks/results/revision_checks.md``). At the defaults inference is
    not at equilibrium by design (the gradient is 42-52 % from the equilibrium's on the MNIST MLP, and with ReLU
    units more steps do not settle it), so ``extras["converged"]`` is usually False and nothing warns; one
    :class:`~inferlearn.errors.ConvergenceWarning` per run says when inference is *far* from equilibrium: more
    residual left than the forward pass had, or a layer whose remaining gradient exceeds twice its prediction
    error (the output error has not propagated down: too few or too small steps for the depth, e.g. ``T = 5``,
    ``η ≤ 0.02``, VGG-7, ResNet-20).
    How far the gradient is from the equilibrium's is not in ``StepInfo`` (it needs the equilibrium): measure
    it with :func:`inferlearn.diagnostics.equilibrium_gap`, or ``inferlearn train --check-equilibrium`` (after
    every epoch, one warning per run above 10 %).

    References:
        Whittington & Bogacz (2017); Zach, bilevel paper, Table 1 (PCN row).
    """

    name = "pc"
    reads_batch_layers = True
    recommended_lr = {"sgd": 0.4, "adam": 1e-4}   # benchmarks/tune_defaults.py, validation splits
    steps: int = 20
    step_size: float = 0.1
    tol: float | None = None
    output_weight: float = 1.0
    output: str = "se"
    inference_optimizer: str = "sgd"
    inference_momentum: float = 0.9
    nudging: str = "clamp"
    beta: float = 0.1
    beta_schedule: str | None = None
    weight_step: float | None = None
    engine: str = "auto"

    def __post_init__(self) -> None:
        check_positive("output_weight", self.output_weight)
        check_engine(self.engine)
        if self.output not in OUTPUTS:
            raise ValueError(f"Invalid output: {self.output!r}; choose one of {list(OUTPUTS)}")
        default = {f.name: f.default for f in fields(self)}   # an option the others make inert is refused
        if self.inference_optimizer == "sgd" and self.inference_momentum != default["inference_momentum"]:
            raise ValueError(f"Invalid inference_momentum: {self.inference_momentum} has no effect with "
                             "inference_optimizer='sgd' (plain steps); add inference_optimizer=momentum (or adam), or "
                             "drop inference_momentum")
        if self.nudging == "clamp" and self.beta != default["beta"]:
            raise ValueError(f"Invalid beta: {self.beta} has no effect with nudging='clamp' (the output is clamped to "
                             "the label); add nudging=target, positive, negative or symmetric, or drop beta")
        if self.inference_optimizer not in ("sgd", *OptimizerSteps.INFERENCE_OPTIMIZERS):
            raise ValueError(f"Invalid inference_optimizer: {self.inference_optimizer!r}; choose one of "
                             f"{['sgd', *OptimizerSteps.INFERENCE_OPTIMIZERS]}")
        if self.inference_optimizer != "sgd" and self.engine == "fused":
            raise ValueError(f"Invalid engine: 'fused' (inference_optimizer={self.inference_optimizer!r} runs on the "
                             "generic engine; use engine='auto')")
        if self.weight_step is not None:
            check_positive("weight_step", self.weight_step)
            if self.inference_optimizer != "sgd" or self.nudging != "clamp" or self.engine == "fused" or self.tol:
                raise ValueError("Invalid weight_step: incremental PC runs plain inference steps on a clamped output "
                                 "on the generic engine, exactly `steps` of them (inference_optimizer='sgd', "
                                 "nudging='clamp', engine='auto', tol=None)")
        self._betas = self._target_betas()
        if self.nudging != "clamp":
            if self.nudging not in ("target", *NUDGINGS):
                raise ValueError(f"Invalid nudging: {self.nudging!r}; choose one of {['clamp', 'target', *NUDGINGS]}")
            if self.nudging != "target":
                check_beta(self.beta)
            if self.engine == "fused":
                raise ValueError(f"Invalid engine: 'fused' (nudging={self.nudging!r} runs on the generic engine; use "
                                 "engine='auto')")
        if isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps == 0:
            raise ValueError("Invalid steps: 0 (predictive coding needs at least one inference step: without one the "
                             "output error stays at the top and only the last layer learns; use steps >= 1)")
        self._solver = self._inference_solver()
        if self.step_size >= 2:   # F's curvature along a value node is at least 1 (its own term): η ≥ 2 diverges
            raise ValueError(f"Invalid step_size: {self.step_size} (must be < 2 for the inference steps to descend)")

    def _target_betas(self) -> tuple[float, ...]:
        """β by epoch of ``nudging="target"`` (``beta_schedule``, or ``beta``), each in ``[−1, 1]`` and not 0.

        Raises:
            ValueError: a value out of range, or a ``beta_schedule`` without ``nudging="target"`` (it would be inert).
        """
        if self.beta_schedule is not None and self.nudging != "target":
            raise ValueError(f"Invalid beta_schedule: it sets PCX's output target per epoch and needs "
                             f"nudging='target' (now {self.nudging!r})")
        if self.nudging != "target":
            return ()
        try:
            betas = (tuple(float(v) for v in str(self.beta_schedule).split(","))
                     if self.beta_schedule is not None else (self.beta,))
        except ValueError:
            betas = (math.nan,)
        for b in betas:
            if isinstance(b, bool) or not (isinstance(b, (int, float)) and math.isfinite(b) and b != 0 and -1 <= b <= 1):
                raise ValueError(f"Invalid beta {b} for nudging='target': give β in [-1, 1], not 0 (beta_schedule: "
                                 f"comma-separated numbers, e.g. 0.9,-0.9)")
        self._epoch_beta = betas[0]
        return betas

    def equilibrium_options(self) -> dict | None:
        """:data:`~inferlearn.engine.solvers.EQUILIBRIUM_STEPS` steps of the same updates, no early stop (``None``
        for incremental PC: its gradient is a sum along the trajectory, not an equilibrium's)."""
        if self.weight_step is not None:
            return None
        return {"steps": max(self.steps, EQUILIBRIUM_STEPS), "tol": None}

    def begin_epoch(self, epoch: int, n_samples: int) -> None:
        """``nudging="target"``: take the epoch's β from ``beta_schedule`` (1-based ``epoch``; the last value repeats)."""
        if self._betas:
            self._epoch_beta = self._betas[min(epoch, len(self._betas)) - 1]

    def _inference_solver(self) -> GradientSteps:
        if self.inference_optimizer == "sgd":
            return GradientSteps(self.steps, self.step_size, self.tol, label=self.name)
        if not (isinstance(self.inference_momentum, (int, float)) and 0 <= self.inference_momentum < 1):
            raise ValueError(f"Invalid inference_momentum: {self.inference_momentum}")
        return OptimizerSteps(self.steps, self.step_size, self.tol, optimizer=self.inference_optimizer,
                              momentum=self.inference_momentum, label=self.name)

    def hidden_gradient_scale(self) -> float:
        """The factor of each hidden node's term of the weight gradient: 1 (ePC's ``rescale`` overrides it)."""
        return 1.0

    def _infer(self, problem: LayeredProblem):
        """``(value nodes, SolveInfo)`` of the inference on a state problem (the generic engine's; ePC overrides it)."""
        return self._solver.solve(problem)

    def energy(self, chain: Graph) -> LayeredEnergy:
        """The penalty energy of a chain (hidden terms weight 1, the output term ``π``)."""
        return penalty_energy(chain, self.output_weight, self.output)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain, fused = self._chain(model, x)
        if self.nudging == "target":
            free = LayeredProblem(self.energy(chain), x)
            u0 = free.forward_state()[1][chain.depth]
            y, beta = one_hot(labels, u0.shape[1], x.dtype), self._epoch_beta
            return self._clamped(chain, False, x, torch.lerp(u0.detach(), y, beta) if beta != 1 else y, free,
                                 grad_scale=1.0 / beta)
        if self.nudging != "clamp":
            return self._nudged(chain, x, labels)
        if self.weight_step is not None:
            return self._incremental(chain, x, labels)
        if fused:
            return self._clamped(chain, True, x, one_hot(labels, chain.nodes[-1].linear.out_features, x.dtype))
        free = LayeredProblem(self.energy(chain), x)   # its forward pass gives the output width, and is reused
        n_out = free.forward_state()[1][chain.depth].shape[1]
        return self._clamped(chain, False, x, one_hot(labels, n_out, x.dtype), free)

    def clamped_backward(self, model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> StepInfo:
        """Clamp the output to ``target`` (any values, e.g. one-hot labels), infer and accumulate ``.grad``.

        ``StepInfo.extras`` holds ``inference_steps``, the inferred ``hidden`` layers, ``solver_residual``,
        ``converged`` and ``far`` (see the class docstring).
        """
        return self._clamped(*self._chain(model, x), x, target)

    def dense_plan(self, model: nn.Module) -> DensePlan | None:
        """The whole-batch fused inference (:func:`~inferlearn.engine.fused.dense_predictive_coding`: a dense chain,
        clamped output, plain steps, a fixed number of them) when it applies to ``model``, else ``None``."""
        try:
            chain, fused = self._chain(model, None)
        except ValueError:
            return None
        if not fused or self.tol is not None or not self.steps or chain.depth < 2:
            return None
        lin, bounds = pc_constants(chain, chain.nodes[0].linear.weight)
        return DensePlan(chain, "pc", (lin, bounds, self.steps, self.step_size, self.output_weight, self.output),
                         finish=lambda stats: self._fused_finish(chain, stats))

    def _fused_finish(self, chain: Graph, stats: list[float]) -> float:
        """The verdict, warnings and finiteness check of a whole-batch call from its statistics (``stats``:
        :func:`~inferlearn.engine.fused.pc_batch_stats`' input); returns the batch's loss."""
        move, first, layers, floor, (loss, total) = pc_batch_stats(stats, chain.depth - 1, self.step_size,
                                                                   chain.nodes[0].linear.weight.dtype)
        self._solver.report(self.steps, move, first, layers, floor)
        if not math.isfinite(total):
            raise NonFiniteError(f"{self.name}: inference diverged (non-finite value nodes or gradients after "
                                 f"{self.steps} steps); lower step_size (now {self.step_size:g})")
        return loss

    def _chain(self, model: nn.Module, x: torch.Tensor):
        chain = read_graph(model, COUPLED, self.name, example=x)
        fused = (chain.is_dense and self.engine != "generic" and self.inference_optimizer == "sgd"
                 and self.nudging == "clamp" and self.weight_step is None)
        if self.engine == "fused" and not fused:
            raise ValueError(f"engine='fused' needs a dense chain; {type(model).__name__} is not one: use engine='auto'")
        return chain, fused

    def _clamped(self, chain, fused: bool, x: torch.Tensor, target: torch.Tensor,
                 free: LayeredProblem | None = None, grad_scale: float = 1.0) -> StepInfo:
        B, L, pi = x.shape[0], chain.depth, self.output_weight
        if fused:
            grads, output, hidden, it, move, first, layers, floor, summary = dense_predictive_coding(
                chain, x.reshape(B, -1), target, self.steps, self.step_size, pi, self.tol, self.output)
            # the same verdict (and warnings) as the generic solver's
            floor = residual_floor(hidden) if floor is None else floor
            info = self._solver.report(it, move, first, layers, floor) if it > 0 else None
            accumulate_dense_grads(chain, grads)
        else:
            free = LayeredProblem(self.energy(chain), x) if free is None else free
            output = chain.nodes[-1].act(free.forward_state()[1][L])
            problem = free.stacked(1, target=target)
            hidden, info = self._infer(problem)
            it = info.iterations
            h = self.hidden_gradient_scale()
            problem.accumulate_weight_grads(hidden, grad_scale / (B * pi), precise=False,
                                            layer_scale=None if h == 1 else [h] * (L - 1) + [1.0])
            summary = None
        if summary is None or not math.isfinite(summary[1]):   # the whole-batch call summed its value nodes and gradients
            check_inference_finite(self.name, chain, hidden, it, self.step_size)
        extras = {"inference_steps": it, "hidden": [h.detach() for h in hidden]}
        if info is not None:
            extras.update(solver_residual=info.residual, converged=info.converged, far=info.far)
        loss = summary[0] if summary is not None else float(quadratic_loss(output, target))
        return StepInfo(loss=loss, output=output.detach(), extras=extras)

    def _nudged(self, chain: Graph, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        """Nudged predictive coding: the output a free value node, the nudged phases stacked into one solve."""
        B, L = x.shape[0], chain.depth
        if L == 1:
            raise ValueError(f"nudging={self.nudging!r} needs a hidden layer (a model of one layer has none to infer)")
        energy = penalty_energy(chain, self.output_weight, "se")
        free = LayeredProblem(energy, x)
        a_top = free.forward_state()[1][L]
        output = chain.nodes[-1].act(a_top)
        y = one_hot(labels, a_top.shape[1], x.dtype)
        phases = [p for p in nudged_phases(self.nudging) if p.sign != 0]   # ∇θF of the free phase is 0
        rows = lambda v: torch.cat([torch.full((B,), float(v(p)), dtype=x.dtype, device=x.device) for p in phases])
        n = len(phases)
        if n > 1 and any(isinstance(m, NORM_TYPES) and m.training for m in chain.modules):
            raise ValueError(f"{self.name}: nudging={self.nudging!r} solves its {n} phases as one stacked batch, over "
                             "which BatchNorm in training mode would mix the phases' statistics; use nudging=clamp, "
                             "target or positive, or model.eval() on the BatchNorm layers")
        problem = NudgedOutputProblem(energy, torch.cat([x] * n), torch.cat([y] * n), rows(lambda p: p.sign),
                                      self.beta, self.output, a1=torch.cat([free.a1] * n))
        hidden, info = self._infer(problem)
        problem.accumulate_weight_grads(hidden, rows(lambda p: p.weight) / (B * self.beta), precise=n > 1)
        check_inference_finite(self.name, chain, hidden, info.iterations, self.step_size)
        extras = {"inference_steps": info.iterations, "hidden": [h.detach() for h in hidden],
                  "solver_residual": info.residual, "converged": info.converged, "far": info.far}
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=extras)

    def _incremental(self, chain: Graph, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        """iPC on working weights (see ``weight_step``): ``.grad += S_T``, the parameters restored to ``θ_0``."""
        B, L, eta, alpha = x.shape[0], chain.depth, self.step_size, self.weight_step
        energy = self.energy(chain)
        params = [p for link in chain.nodes for p in link.parameters() if p.requires_grad]
        params = list({id(p): p for p in params}.values())
        held = [p.grad for p in params]
        start = [p.detach().clone() for p in params]
        first = LayeredProblem(energy, x)
        output = chain.nodes[-1].act(first.forward_state()[1][L])
        target = one_hot(labels, output.shape[1], x.dtype)
        hidden = [h.clone() for h in first.forward_state()[0]]
        move = 0.0
        try:
            for p in params:
                p.grad = None
            for _ in range(self.steps):
                problem = LayeredProblem(energy, x, target=target)   # a fresh problem: A_1(x) at the current weights
                with torch.no_grad():
                    old = [h.clone() for h in hidden]
                    hidden = problem.gradient_step(hidden, eta)
                    move = max((float((h - o).abs().max()) for h, o in zip(hidden, old)), default=0.0)
                problem.accumulate_weight_grads(hidden, 1.0 / (B * self.output_weight), precise=False)
                with torch.no_grad():
                    for p, p0 in zip(params, start):
                        p.copy_(torch.add(p0, p.grad, alpha=-alpha))
        except BaseException:
            for p, g in zip(params, held):   # a failed step leaves .grad as it found it
                p.grad = g
            raise
        finally:
            with torch.no_grad():
                for p, p0 in zip(params, start):
                    p.copy_(p0)
        for p, g in zip(params, held):
            if g is not None:
                p.grad = g.add_(p.grad) if p.grad is not None else g
        check_inference_finite(self.name, chain, hidden, self.steps, eta)
        extras = {"inference_steps": self.steps, "hidden": [h.detach() for h in hidden], "last_move": move}
        return StepInfo(loss=float(quadratic_loss(output, target)), output=output.detach(), extras=extras)
