"""Boxes: the convex sets ``C = [lower, upper]`` of lifted-network units and argmin-layer constraints.

One class, :class:`Box` (also spelled :data:`Box`, the lifted engine's name for it), is both

* a **unit set** of a lifted network: each hidden unit type is a box ``[lower, upper]`` (possibly
  unbounded) and the activation is the projection ``Π_C(a) = clamp(a, lower, upper)`` -- the
  proximal map of the indicator ``ι_C``; and
* the **constraint** ``z ∈ C`` of an argmin layer (:mod:`inferlearn.bilevel`), where the bounds may
  also be per-coordinate tensors (e.g. ``Box(lower=torch.zeros(n))``).

==============  =============  =================
name            set C          activation
==============  =============  =================
``linear``      ℝ              identity
``relu``        ℝ≥0            max(0, a)
``hard-sigmoid`` [0, 1]         clamp(a, 0, 1)
``hard-tanh``   [-1, 1]        clamp(a, -1, 1)
==============  =============  =================

References:
    Zach & Estellers, "Contrastive learning for lifted networks", Sec. 3, Eq. 1 (docs/maths.md §A);
    Zach, "Bilevel programs meet deep learning", Prop. 2 (box constraints of the inner problem).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

Bound = float | torch.Tensor

_UNSET = object()


def _check_bound(side: str, b) -> Bound:
    """A bound as stored: a float (``±inf`` = unbounded, ``None`` read as ``∓inf``) or a tensor."""
    if b is None:
        return -math.inf if side == "lower" else math.inf
    if isinstance(b, torch.Tensor):
        if b.is_floating_point() and torch.isnan(b).any():
            raise ValueError(f"Invalid {side} bound: contains NaN")
        return b
    if isinstance(b, bool) or not isinstance(b, (int, float)) or math.isnan(b):
        raise ValueError(f"Invalid {side} bound: {b!r}")
    return float(b)


_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _adjacent(bound: float, dtype: torch.dtype, up: bool) -> float:
    """The ``dtype`` number just above (``up``) or below ``bound``: ``a > below(lo)`` ⟺ ``a ≥ lo`` in that dtype."""
    b = torch.tensor(bound, dtype=dtype)
    return float(torch.nextafter(b, torch.tensor(math.inf if up else -math.inf, dtype=dtype)))


@dataclass(frozen=True, init=False, eq=False, repr=False)
class Box:
    """The convex set ``C = {z : lower ≤ z ≤ upper}`` (coordinate-wise), and its projection ``Π_C``.

    Constructed as ``Box(lower, upper)`` or, with a name first, ``Box(name, lower, upper)`` (the
    spelling ``Box("relu", 0.0, math.inf)`` of the lifted engine); every argument may also be
    given by keyword. ``None`` and ``±inf`` both mean unbounded on that side and are stored as
    ``∓inf``. Bounds are floats (the unit sets of lifted networks) or, for argmin-layer constraints,
    tensors that broadcast to the variable's shape *without enlarging it* (e.g. shape ``(n,)`` for a
    variable of shape ``(batch, n)``, checked by :meth:`check`).

    Instances are immutable. Equality and hashing compare the name and the bounds: floats by value,
    tensors by identity (so float boxes behave as the frozen dataclass values the lifted engine
    keys on, e.g. ``u.lower == 0.0``, ``math.isinf(u.upper)``, ``u is RELU``).

    Attributes:
        name: the CLI name of a unit set (``relu``, ``hard-sigmoid``, ...), ``None`` for an
            anonymous box.
        lower: lower bound (float, ``-inf`` if unbounded, or tensor).
        upper: upper bound (float, ``+inf`` if unbounded, or tensor).

    Raises:
        ValueError: a NaN or non-numeric bound, or a lower bound that is not ``<`` its upper bound.
    """

    name: str | None
    lower: Bound
    upper: Bound

    def __init__(self, *args, lower=_UNSET, upper=_UNSET, name: str | None = None):
        if args and isinstance(args[0], str):
            name, args = args[0], args[1:]
        if len(args) > 2:
            raise TypeError(f"Box takes at most (name, lower, upper); got {len(args)} bounds")
        given = dict(zip(("lower", "upper"), args))
        for side, value in (("lower", lower), ("upper", upper)):
            if value is not _UNSET:
                if side in given:
                    raise TypeError(f"Box got two values for {side!r}")
                given[side] = value
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Box name must be a string, got {type(name).__name__}")
        lo, hi = _check_bound("lower", given.get("lower")), _check_bound("upper", given.get("upper"))
        if isinstance(lo, float) and isinstance(hi, float):
            ok = lo < hi
        elif (isinstance(lo, float) and lo == -math.inf) or (isinstance(hi, float) and hi == math.inf):
            # one side is unbounded: nothing to compare
            ok = True
        else:
            lo_t, hi_t = torch.as_tensor(lo, dtype=torch.float64), torch.as_tensor(hi, dtype=torch.float64)
            try:
                ok = bool((lo_t < hi_t).all())
            except RuntimeError:
                raise ValueError(f"Box bounds of shapes {tuple(lo_t.shape)} and {tuple(hi_t.shape)} "
                                 "do not broadcast") from None
        if not ok:
            what = f"{name!r}" if name is not None else f"[{lo!r}, {hi!r}]"
            raise ValueError(f"Invalid box {what}: every lower bound must be < its upper bound")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        # float boxes (the unit sets, on the lifted engine's hot path): the clamp arguments, precomputed
        plain = (None if lo == -math.inf else lo, None if hi == math.inf else hi) \
            if isinstance(lo, float) and isinstance(hi, float) else None
        object.__setattr__(self, "_plain", plain)
        # per floating dtype, the thresholds of _FloatClamp's backward (made here: a traced function cannot make them)
        object.__setattr__(self, "_thresholds", {} if plain is None else {
            dt: (None if plain[0] is None else _adjacent(plain[0], dt, up=False),
                 None if plain[1] is None else _adjacent(plain[1], dt, up=True)) for dt in _FLOAT_DTYPES})

    # -- constructors --------------------------------------------------------------------------------
    @classmethod
    def nonnegative(cls) -> "Box":
        """``z ≥ 0`` (non-negative least squares): the ReLU unit set :data:`RELU` itself."""
        return RELU

    @classmethod
    def from_units(cls, units: "str | Box") -> "Box":
        """The box of a lifted-network unit set: the unit set itself (names are looked up)."""
        return get_units(units)

    # -- value semantics -----------------------------------------------------------------------------
    def _key(self) -> tuple:
        def k(b):
            return ("tensor", id(b)) if isinstance(b, torch.Tensor) else b
        return self.name, k(self.lower), k(self.upper)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Box):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        name = "" if self.name is None else f"name={self.name!r}, "
        return f"Box({name}lower={self.lower!r}, upper={self.upper!r})"

    # -- shape of the set ----------------------------------------------------------------------------
    @property
    def has_lower(self) -> bool:
        """Whether the set is bounded below (a tensor bound counts as bounded)."""
        return not (isinstance(self.lower, float) and self.lower == -math.inf)

    @property
    def has_upper(self) -> bool:
        """Whether the set is bounded above (a tensor bound counts as bounded)."""
        return not (isinstance(self.upper, float) and self.upper == math.inf)

    @property
    def is_linear(self) -> bool:
        """True when the set is all of ℝ (no constraint, identity activation)."""
        return self._plain == (None, None)

    @property
    def is_unconstrained(self) -> bool:
        """Same as :attr:`is_linear` (the argmin layer's name: no constraint on ``z``)."""
        return self.is_linear

    def check(self, shape: torch.Size) -> None:
        """Raise ``ValueError`` unless both bounds broadcast to ``shape`` without enlarging it."""
        for side, b in (("lower", self.lower), ("upper", self.upper)):
            if isinstance(b, torch.Tensor):
                try:
                    out = torch.broadcast_shapes(b.shape, shape)
                except RuntimeError:
                    out = None
                if out != torch.Size(shape):
                    raise ValueError(f"Constraint {side} bound of shape {tuple(b.shape)} does not match the "
                                     f"variable of shape {tuple(shape)} (it must broadcast to it)")

    def clamp_bounds(self, z: torch.Tensor) -> tuple[Bound | None, Bound | None]:
        """The bounds as ``torch.clamp`` takes them for ``z``: ``None`` where unbounded, tensors cast to ``z``."""
        if self._plain is not None:
            return self._plain
        lo, hi = self.lower, self.upper
        lo = lo.to(z) if isinstance(lo, torch.Tensor) else None if lo == -math.inf else lo
        hi = hi.to(z) if isinstance(hi, torch.Tensor) else None if hi == math.inf else hi
        # torch.clamp takes two numbers or two tensors, not one of each
        if isinstance(lo, torch.Tensor) and isinstance(hi, float):
            hi = torch.full_like(lo, hi)
        elif isinstance(hi, torch.Tensor) and isinstance(lo, float):
            lo = torch.full_like(hi, lo)
        return lo, hi

    # -- maps ----------------------------------------------------------------------------------------
    def project(self, a: torch.Tensor) -> torch.Tensor:
        """``Π_C(a)``, the coordinate-wise clamp: the activation applied to pre-activations ``a``."""
        lo, hi = self.clamp_bounds(a)
        if lo is None and hi is None:
            return a
        if a.requires_grad and torch.is_grad_enabled() and a.dtype in self._thresholds:
            return _FloatClamp.apply(a, lo, hi, *self._thresholds[a.dtype])
        return a.clamp(min=lo, max=hi)

    def engaged(self, a: torch.Tensor) -> torch.Tensor:
        """Boolean mask where the projection changes ``a`` (strictly outside ``C``: the non-linearity is active)."""
        lo, hi = self.clamp_bounds(a)
        if lo is None and hi is None:
            return torch.zeros_like(a, dtype=torch.bool)
        if hi is None:
            return a < lo
        if lo is None:
            return a > hi
        return (a < lo) | (a > hi)

    def at_bound(self, z: torch.Tensor, tol: float) -> torch.Tensor:
        """Boolean mask of coordinates within ``tol`` of a bound (the active set of ``z ∈ C``)."""
        mask = torch.zeros_like(z, dtype=torch.bool)
        lo, hi = self.clamp_bounds(z)
        if lo is not None:
            mask |= z <= lo + tol
        if hi is not None:
            mask |= z >= hi - tol
        return mask

    def normal_cone_violation(self, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Residual of ``0 ∈ g + N_C(z)`` per coordinate: ``z - Π_C(z - g)``.

        It is zero exactly at a minimiser of a convex function with gradient ``g`` over ``C``
        (the projected-gradient fixed point), and is used as the optimality residual of solvers.
        """
        return z - self.project(z - g)


LINEAR = Box("linear", -math.inf, math.inf)
RELU = Box("relu", 0.0, math.inf)
HARD_SIGMOID = Box("hard-sigmoid", 0.0, 1.0)
HARD_TANH = Box("hard-tanh", -1.0, 1.0)

UNIT_SETS = {u.name: u for u in (LINEAR, RELU, HARD_SIGMOID, HARD_TANH)}


# other spellings of the same units (one vocabulary on every command)
ALIASES = {"hardsigmoid": "hard-sigmoid", "hardtanh": "hard-tanh", "identity": "linear", "none": "linear"}


def get_units(name: str | Box) -> Box:
    """Look up a unit set by name (``relu``, ``hard-sigmoid`` or ``hardsigmoid``, ...); a :class:`Box` is returned as is.

    Raises ``ValueError`` listing the known names.
    """
    if isinstance(name, Box):
        return name
    key = str(name).lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in UNIT_SETS:
        raise ValueError(f"Unknown unit type {name!r}; choose one of {sorted(UNIT_SETS)}")
    return UNIT_SETS[key]


def box(lower: float, upper: float) -> Box:
    """The unit set ``[lower, upper]``, named after the known set it equals (else ``box[lo,hi]``)."""
    for u in UNIT_SETS.values():
        if u.lower == lower and u.upper == upper:
            return u
    return Box(f"box[{lower:g},{upper:g}]", float(lower), float(upper))


class _FloatClamp(torch.autograd.Function):
    """``clamp(a, lo, hi)`` with number bounds and ``torch.clamp``'s derivative: 1 where the clamp leaves ``a``
    unchanged (``lo ≤ a ≤ hi``, bounds included), 0 elsewhere. Its backward is ReLU's kernel
    (``threshold_backward``, which passes ``g`` where ``a > t``) with ``t`` the number just below ``lo`` in ``a``'s
    dtype, so ``a > t`` ⟺ ``a ≥ lo`` exactly; the upper bound likewise on ``−a``. The same values and gradients as
    ``torch.clamp``, whose backward goes through boolean masks, several times slower on CPU
    (``benchmarks/bench_units.py``)."""

    @staticmethod
    def forward(ctx, a, lo, hi, below_lo, above_hi):
        ctx.save_for_backward(a)
        ctx.thresholds = below_lo, above_hi
        return a.clamp(min=lo, max=hi)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        below_lo, above_hi = ctx.thresholds
        if below_lo is not None:
            g = torch.ops.aten.threshold_backward(g, a, below_lo)
        if above_hi is not None:
            g = torch.ops.aten.threshold_backward(g, a.neg(), -above_hi)
        return g, None, None, None, None


class Clamp(nn.Module):
    """The activation ``Π_C(a) = clamp(a, lower, upper)`` of a unit set, as a module.

    Put it in your own ``nn.Sequential`` to use a unit type that PyTorch has no module for (e.g.
    ``Clamp("hard-sigmoid")``, the clamp to ``[0, 1]``); ``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardtanh`` and
    ``nn.Identity`` are recognised as unit sets too (:func:`units_of_module`).

    Args:
        units: a unit-set name or a :class:`Box` with float bounds.
    """

    def __init__(self, units: str | Box = "hard-sigmoid"):
        super().__init__()
        self.units = get_units(units)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return self.units.project(a)

    def extra_repr(self) -> str:
        return self.units.name if self.units.name is not None else repr(self.units)


def units_of_module(module: nn.Module) -> Box | None:
    """The unit set whose projection ``module`` computes, or ``None`` if it is not a box projection.

    ``nn.ReLU`` → ``relu``; ``nn.ReLU6`` → ``[0, 6]``; ``nn.Hardtanh(lo, hi)`` → ``[lo, hi]`` (so
    ``nn.Hardtanh(0, 1)`` is ``hard-sigmoid``); ``nn.Identity`` → ``linear``; :class:`Clamp` → its set.
    ``nn.Hardsigmoid`` is *not* a box projection (it is ``clamp(a/6 + 1/2, 0, 1)``).
    """
    if isinstance(module, Clamp):
        return module.units
    if isinstance(module, nn.ReLU6):
        return box(0.0, 6.0)
    if isinstance(module, nn.ReLU):
        return RELU
    if isinstance(module, nn.Hardtanh):   # ReLU6 is a Hardtanh subclass: checked above
        return box(float(module.min_val), float(module.max_val))
    if isinstance(module, nn.Identity):
        return LINEAR
    return None


def __getattr__(name: str):
    if name == "UnitSet":   # the old name of Box
        import warnings
        warnings.warn("inferlearn.units.UnitSet is renamed inferlearn.units.Box; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        return Box
    raise AttributeError(f"module 'inferlearn.units' has no attribute {name!r}")
