"""Non-negative least squares and the DeepFacto NMF module.

DeepFacto (docs/maths.md §C) puts a non-negative factorisation between two blocks of a network: the
output ``z`` (flattened, ``n`` features) of one block is written ``z ≈ M s`` with a basis
``M ≥ 0`` (``n × r``, shared) and scores ``s ≥ 0`` (``r`` per sample), and only ``s`` feeds the next
block. In row convention (samples are rows) ``Z ≈ S Mᵀ``. Back-propagation cannot pass this layer;
block-ADMM trains through it (:mod:`inferlearn.admm`), updating ``M`` and ``S`` alternately, each
a convex non-negative least-squares (NNLS) problem.

Every NNLS problem here has the *Gram form*

    min_{X ≥ 0}  Σ_i ½ x_iᵀ G x_i − c_iᵀ x_i        (rows x_i of X, G symmetric PSD, r × r)

which covers ``min_{x ≥ 0} ½‖A x − b‖²`` (``G = AᵀA``, ``c = Aᵀb``), the basis update
(``A = S``), the score update (``A = M``) and the score update with a prox term and a linearised
next-block term used inside block-ADMM. :func:`nnls_gram` solves all rows at once by exact cyclic
coordinate descent (the HALS update), which converges to the unique minimiser when ``G`` is
positive definite and to a minimiser otherwise.

References:
    Khorram et al., "Stochastic Block-ADMM for Training Deep Networks" (seed 003), §3.4 (DeepFacto);
    Lee & Seung 1999 (NMF); Cichocki & Phan 2009 (HALS coordinate descent for NNLS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class NNLSInfo:
    """Outcome of :func:`nnls_gram`: sweeps used, final projected-gradient norm, converged flag."""

    sweeps: int
    pg_norm: float
    converged: bool


def _projected_gradient(X: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    # KKT residual of min_{x≥0}: the gradient where x > 0, its negative part where x = 0.
    return torch.where(X > 0, grad, grad.clamp(max=0))


def nnls_gram(G: torch.Tensor, C: torch.Tensor, X0: torch.Tensor | None = None, max_sweeps: int = 200,
              tol: float = 1e-8) -> tuple[torch.Tensor, NNLSInfo]:
    """Solve ``min_{X ≥ 0} Σ_i ½ x_iᵀ G x_i − c_iᵀ x_i`` for all rows at once.

    Cyclic coordinate descent: for ``j = 1 … r``, ``x_ij ← max(0, x_ij − (x_iᵀ G_{:,j} − c_ij) / G_jj)``,
    with the gradient ``X G − C`` updated in place (one sweep costs ``O(n r²)``).

    Args:
        G: ``(r, r)`` symmetric positive semi-definite matrix.
        C: ``(n, r)`` linear terms, one row per problem.
        X0: optional warm start (clamped to ``≥ 0``).
        max_sweeps: at most this many sweeps over the ``r`` coordinates.
        tol: stop when ``max |projected gradient| ≤ tol · (1 + max |C|)``.

    Returns:
        ``(X, info)``; ``X`` has ``C``'s shape and is ``≥ 0``. Not converging within ``max_sweeps``
        is reported in ``info`` (inside block-ADMM inexact sub-problem solves are intended).

    Note:
        A coordinate with ``G_jj = 0`` (a zero column of ``A``) has a zero linear term too when
        ``G, C`` come from least squares; it is set to 0.
    """
    if G.dim() != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"G must be a square matrix, got shape {tuple(G.shape)}")
    if C.dim() != 2 or C.shape[1] != G.shape[0]:
        raise ValueError(f"C must have shape (n, {G.shape[0]}), got {tuple(C.shape)}")
    r = G.shape[0]
    X = torch.zeros_like(C) if X0 is None else X0.to(C).clamp(min=0).clone()
    grad = X @ G - C
    diag = torch.diagonal(G)
    dead = diag <= 0
    scale = tol * (1.0 + float(C.abs().max())) if C.numel() else tol
    pg = float("inf")
    sweeps = 0
    for sweeps in range(1, max_sweeps + 1):
        for j in range(r):
            if dead[j]:
                delta = -X[:, j]
            else:
                delta = (X[:, j] - grad[:, j] / diag[j]).clamp(min=0) - X[:, j]
            X[:, j] += delta
            grad.addr_(delta, G[j])
        pg = float(_projected_gradient(X, grad).abs().max()) if X.numel() else 0.0
        if pg <= scale:
            return X, NNLSInfo(sweeps, pg, True)
    return X, NNLSInfo(sweeps, pg, False)


def nnls(A: torch.Tensor, B: torch.Tensor, max_sweeps: int = 1000, tol: float = 1e-10) -> torch.Tensor:
    """``argmin_{x ≥ 0} ‖A x − b‖²`` for each column ``b`` of ``B`` (``A``: ``m × r``, ``B``: ``m × k``).

    Returns ``X`` of shape ``(r, k)``; a 1-D ``B`` gives a 1-D result (like ``scipy.optimize.nnls``).
    """
    vec = B.dim() == 1
    B2 = B.unsqueeze(1) if vec else B
    if A.dim() != 2 or B2.shape[0] != A.shape[0]:
        raise ValueError(f"Shapes do not match: A {tuple(A.shape)}, B {tuple(B.shape)}")
    X, _ = nnls_gram(A.T @ A, (A.T @ B2).T, max_sweeps=max_sweeps, tol=tol)
    X = X.T
    return X[:, 0] if vec else X


class NMF(nn.Module):
    """DeepFacto NMF module: ``z ≈ M s`` with ``M ≥ 0`` (``n_features × rank``), output ``s ≥ 0``.

    At test time (``forward``) the scores are the NNLS projection ``s = argmin_{s ≥ 0} ‖z − M s‖²``
    of the flattened input, computed without autograd (the layer is not differentiable; train it
    with :class:`inferlearn.admm.BlockADMM`). During block-ADMM the scores ``S`` of the training
    samples are decoupling variables and the multipliers ``V`` live in the trainer.

    Args:
        n_features: flattened size ``n`` of the block output this module factorises.
        rank: ``r``, with ``1 ≤ r ≤ n``.
        seed: seed of the uniform random initial basis.
        sweeps: coordinate-descent sweeps for the test-time projection.

    Raises:
        ValueError: ``rank`` not in ``1 … n_features``.

    References:
        Seed 003, §3.4 and Fig. 2 (NMF module between blocks; test-time non-negative projection).

    Note:
        The paper solves the test-time projection with L-BFGS; we use exact coordinate descent on
        the same convex problem (same minimiser).
    """

    def __init__(self, n_features: int, rank: int, seed: int | None = 0, sweeps: int = 100,
                 tol: float = 1e-6, dtype: torch.dtype = torch.float32):
        super().__init__()
        if not (isinstance(n_features, int) and n_features >= 1):
            raise ValueError(f"Invalid n_features: {n_features}")
        if not (isinstance(rank, int) and 1 <= rank <= n_features):
            raise ValueError(f"Invalid NMF rank {rank}: it must lie in 1..{n_features} (the feature dimension of "
                             f"the block output being factorised); a rank above the feature dimension cannot "
                             f"give a low-rank factorisation")
        self.n_features, self.rank, self.sweeps, self.tol = n_features, rank, int(sweeps), float(tol)
        g = torch.Generator().manual_seed(0 if seed is None else seed)
        self.register_buffer("M", torch.rand(n_features, rank, generator=g, dtype=dtype))

    def extra_repr(self) -> str:
        return f"n_features={self.n_features}, rank={self.rank}"

    def _flat(self, z: torch.Tensor) -> torch.Tensor:
        z = z.reshape(z.shape[0], -1)
        if z.shape[1] != self.n_features:
            raise ValueError(f"NMF module expects {self.n_features} features per sample, got {z.shape[1]}")
        return z.to(self.M.dtype)

    @torch.no_grad()
    def project(self, z: torch.Tensor, S0: torch.Tensor | None = None, sweeps: int | None = None) -> torch.Tensor:
        """Scores ``S = argmin_{S ≥ 0} ‖Z − S Mᵀ‖²`` of a batch (rows are samples)."""
        z = self._flat(z)
        S, _ = nnls_gram(self.M.T @ self.M, z @ self.M, S0, max_sweeps=sweeps or self.sweeps, tol=self.tol)
        return S

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.project(z)

    @torch.no_grad()
    def update_basis(self, target: torch.Tensor, S: torch.Tensor, sweeps: int = 10) -> None:
        """``M ← argmin_{M ≥ 0} ‖target − S Mᵀ‖²`` (warm-started coordinate descent)."""
        target = self._flat(target)
        M, _ = nnls_gram(S.T @ S, target.T @ S, self.M, max_sweeps=sweeps, tol=self.tol)
        self.M.copy_(M)

    @torch.no_grad()
    def fit(self, Z: torch.Tensor, iters: int = 50, sweeps: int = 10) -> torch.Tensor:
        """Plain NMF of ``Z`` by alternating NNLS (the "NMF after training" baseline and warm start).

        Columns of ``M`` are rescaled to unit norm after each basis update (``S Mᵀ`` is invariant
        to ``S D, M D⁻¹``), which keeps the alternation well conditioned. Returns the scores.
        """
        Z = self._flat(Z)
        if float(Z.min()) < 0:
            Z = Z.clamp(min=0)  # NMF of a signed matrix: only the non-negative part can be represented
        # Start from a basis with the data's scale so the first score update is not degenerate.
        self.M.mul_(math.sqrt(float(Z.pow(2).mean()) + 1e-12) / (float(self.M.pow(2).mean()) ** 0.5 + 1e-12))
        S = self.project(Z, sweeps=sweeps)
        for _ in range(iters):
            self.update_basis(Z, S, sweeps=sweeps)
            norms = self.M.norm(dim=0).clamp(min=1e-12)
            self.M.div_(norms)
            S = self.project(Z, S * norms, sweeps=sweeps)
        return S
