"""The protocol every inference problem implements, so that solvers ask problems and never test their class.

A *problem* is one batch of ``min_z E(z)`` over the hidden value nodes of an energy (:mod:`.layered_energy`,
:mod:`.dense`). A solver (:mod:`inferlearn.engine.solvers`) needs from it:

* its shape: :attr:`~Problem.batch`, :attr:`~Problem.depth`, :attr:`~Problem.n_clamped`;
* its starting point and checks: :meth:`~Problem.forward_state`, :meth:`~Problem.pre_of`,
  :meth:`~Problem.check_feasible`;
* how far a point is from the minimiser: :meth:`~Problem.residuals`, :meth:`~Problem.gradients`;
* for the block solvers, the step bounds and the block step: :meth:`~Problem.feeds_only_output`,
  :meth:`~Problem.block_curvature`, :meth:`~Problem.block_sweeps`, and :attr:`~Problem.dense_hessian` (whether the
  reference solver may polish with the dense Hessian);
* for predictive coding's steps, :meth:`~Problem.gradient_step` and :meth:`~Problem.layer_errors` (the problems of
  value nodes and of errors, :mod:`.error_problem`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch


class BatchProblem:
    """What every inference problem answers: its batch size (rows) and depth ``L`` (a mixin)."""

    x: torch.Tensor

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def depth(self) -> int:
        return self.energy.depth


@runtime_checkable
class Problem(Protocol):
    """The inference problem a solver minimises (module docstring)."""

    x: torch.Tensor
    n_clamped: int
    dense_hessian: bool

    @property
    def batch(self) -> int: ...

    @property
    def depth(self) -> int: ...

    def forward_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``(hidden, pre)`` of the forward pass (the start of every solve)."""

    def pre_of(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """``[None, a_1, …, a_L]`` at ``hidden``."""

    def check_feasible(self, hidden: Sequence[torch.Tensor]) -> None:
        """Raise ``ValueError`` unless ``hidden`` is a point of the problem (shapes, box, finiteness)."""

    def residuals(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-row optimality residual (0 at the minimiser)."""

    def gradients(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``[∂E/∂z_1, …, ∂E/∂z_{L-1}]``."""

    def feeds_only_output(self, k: int) -> bool:
        """Whether hidden node ``k``'s only children are the output (a free output then makes its block exact)."""

    def block_curvature(self, k: int, hidden: Sequence[torch.Tensor] | None) -> float:
        """An upper bound ``λ_k`` of block ``k``'s scaled curvature above ``w_k I`` (``‖A_{k+1}‖₂²`` on a chain)."""

    def block_sweeps(self, hidden: list[torch.Tensor], pre: list[torch.Tensor | None], steps: Sequence[float]
                     ) -> tuple[Callable[[bool], list[torch.Tensor]], Callable[[], list[torch.Tensor]]]:
        """``(sweep, result)``: ``sweep(check)`` runs one block projected-gradient sweep with step ``steps[k − 1]`` on
        block ``k`` (returning the blocks' largest steps when ``check``), ``result()`` the hidden layers reached."""
