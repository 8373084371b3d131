"""Reading any ``nn.Module`` as a graph of layer maps and units by ``torch.fx`` tracing.

A model whose forward is not a plain sequence (a residual block ``relu(f(x) + x)``, a concatenation of
branches) is read into the same :class:`~inferlearn.engine.graph.types.Graph` of nodes as a chain, with a
node's pre-activation the **sum** of its incoming maps::

    a_k = Σ_{e into k} A_e(z_{source(e)}),    z_k = f_k(a_k)

by :func:`trace_graph`, which follows the operations ``torch.fx.symbolic_trace`` records:

* a **unit** (``nn.ReLU``, ``nn.Hardtanh``, :class:`~inferlearn.units.Clamp`, any element-wise
  activation module, or ``F.relu``/``torch.relu``/``torch.tanh``/... as functions) makes a node: the value
  node (lifted variable) sits after it, as on a chain;
* a **layer map** (``Linear``, ``Conv``, pooling, ``Flatten``, normalisation, a module declared with
  :func:`~inferlearn.engine.graph.types.declare_affine` or :func:`~inferlearn.engine.graph.types.declare_map`) extends the edge it reads;
* ``+`` and ``-`` sum edges; multiplying or dividing by a number, ``torch.cat`` (zero-padding each part
  into its slot), slicing ``x[:, i:j]``, ``flatten``/``view``/``reshape`` of the non-batch dimensions and
  average pooling/means are linear maps, applied to every edge of a sum (they have no bias);
* a sum that feeds more than one operation, or a map with a bias, becomes a node of its own with a
  linear unit (the value node of a residual stream), so no map is evaluated twice;
* any other differentiable operation — a product of two tensors, ``matmul``, ``softmax``, attention, a gate,
  ``transpose``, a module called with several arguments — joins a **joint map**: the ``fx`` sub-graph between
  value nodes, evaluated as one call ``g(z_{p1}, …, z_{pm}; θ)`` (a :class:`~inferlearn.engine.graph.types.JointEdge`)
  that predictive coding, ePC, MAC, Fenchel BP and BP differentiate and the lifted energies refuse by name.

Value nodes sit after every activation and after every sum read twice (a residual stream): in a pre-norm
transformer block ``x + attn(ln(x))`` the attention is one joint map into the stream's node; a module declared
with :func:`~inferlearn.engine.graph.types.declare_map` is one map with no value node inside. Refused in one line
naming the node and the fix: data-dependent control flow, a tensor attribute used directly, the input's shape read
at run time, and operations that are not differentiable or are random (``detach``, ``argmax``, ``F.dropout``; a
dropout *module* is a map, whose mask predictive coding and ePC hold fixed per batch). What fx cannot trace can still be given by the
**graph protocol** (:mod:`~inferlearn.engine.graph.protocol`): a method ``inferlearn_graph(self)`` returning
:class:`~inferlearn.engine.graph.protocol.NodeSpec` objects in topological
order (node ``i`` is the ``i``-th, 1-based; source 0 is the input; the last node is the output).

References:
    ``torch.fx`` (Reed et al. 2022); Pinchetti et al. (2024), PCX (value nodes after each block of a
    residual network).
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import fx, nn

from ...units import units_of_module
from .types import is_activation, DROPOUT_TYPES, Edge, JointEdge, JointMap, Node, check_graph, check_single_use, is_map


class Scale(nn.Module):
    """``z ↦ c z`` (a number times a tensor in a traced forward: branch scaling ``x + f(x)/√L``)."""

    def __init__(self, c: float):
        super().__init__()
        self.c = float(c)
        self.inferlearn_affine = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.c

    def extra_repr(self) -> str:
        return f"{self.c:g}"


class Slot(nn.Module):
    """``z ↦`` the zero-padded embedding of ``z`` into slot ``[before, before + n)`` of dimension ``dim`` of a
    concatenation (``torch.cat([u, v], dim) = Slot_u(u) + Slot_v(v)``); its adjoint is the slice."""

    def __init__(self, dim: int, before: int, after: int):
        super().__init__()
        self.dim, self.before, self.after = dim, before, after
        self.inferlearn_affine = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        pad = [0, 0] * (z.dim() - 1 - self.dim) + [self.before, self.after]
        return F.pad(z, pad)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, before={self.before}, after={self.after}"


class Index(nn.Module):
    """``z ↦ z[index]`` with a tuple of slices/integers that keeps the batch dimension (``x[:, 3:7]``)."""

    def __init__(self, index):
        super().__init__()
        self.index = index
        self.inferlearn_affine = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z[self.index]

    def extra_repr(self) -> str:
        return repr(self.index)


class Reshape(nn.Module):
    """``z ↦ z.reshape(batch, *shape)`` (``view``/``reshape``/``flatten`` of the non-batch dimensions)."""

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.inferlearn_affine = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z.reshape(z.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return repr(self.shape)


class Function(nn.Module):
    """A traced function call ``fn(z, *args, **kwargs)`` as a module (pooling and means; ``linear`` ones
    have no bias and are declared affine)."""

    def __init__(self, fn, args: tuple, kwargs: dict, linear: bool):
        super().__init__()
        self.fn, self.args, self.kwargs, self.linear = fn, tuple(args), dict(kwargs), linear
        if linear:
            self.inferlearn_affine = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.fn(z, *self.args, **self.kwargs)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


# traced activation functions (and tensor methods of the same name) → an equivalent module
_ACT_FUNCTIONS = {
    torch.relu: lambda a, k: nn.ReLU(), F.relu: lambda a, k: nn.ReLU(), "relu": lambda a, k: nn.ReLU(),
    F.relu6: lambda a, k: nn.ReLU6(),
    F.hardtanh: lambda a, k: nn.Hardtanh(*a, **{n: v for n, v in k.items() if n in ("min_val", "max_val")}),
    torch.sigmoid: lambda a, k: nn.Sigmoid(), F.sigmoid: lambda a, k: nn.Sigmoid(), "sigmoid": lambda a, k: nn.Sigmoid(),
    torch.tanh: lambda a, k: nn.Tanh(), F.tanh: lambda a, k: nn.Tanh(), "tanh": lambda a, k: nn.Tanh(),
    F.gelu: lambda a, k: nn.GELU(**k), F.silu: lambda a, k: nn.SiLU(), F.elu: lambda a, k: nn.ELU(*a),
    F.leaky_relu: lambda a, k: nn.LeakyReLU(*a, **{n: v for n, v in k.items() if n == "negative_slope"}),
    F.softplus: lambda a, k: nn.Softplus(*a, **k), F.hardsigmoid: lambda a, k: nn.Hardsigmoid(),
}
# traced linear functions (no bias) and differentiable ones
_LINEAR_FUNCTIONS = {F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
                     torch.mean, "mean"}
_SMOOTH_FUNCTIONS = {F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d}
_ADD = {operator.add, operator.iadd, torch.add, "add", "add_"}
_SUB = {operator.sub, operator.isub, torch.sub, "sub"}
_MUL = {operator.mul, operator.imul, torch.mul, "mul"}
_DIV = {operator.truediv, operator.itruediv, torch.div, "div"}
_CAT = {torch.cat, torch.concat}
_RESHAPE = {"view", "reshape", "flatten", torch.flatten, torch.reshape, "unflatten", torch.unflatten}
_PASS = {"contiguous", "clone"}
_BATCH = object()   # x.size(0) / x.shape[0]: the batch size in a view or reshape
_MATMUL = {operator.matmul, torch.matmul, "matmul", torch.bmm, "bmm"}
# not differentiable, or random: a joint map is evaluated at every inference step and differentiated
_REFUSED = {"detach", "detach_", torch.detach, torch.argmax, "argmax", torch.argmin, "argmin", "item", "tolist",
            "numpy", torch.round, "round", torch.sign, "sign", torch.floor, "floor", torch.ceil, "ceil", F.dropout,
            torch.dropout, "bernoulli", torch.bernoulli, torch.rand_like, torch.randn_like, torch.randint_like,
            operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}


class _Joint:
    """A traced tensor that is a differentiable function of one or more node values: ``fn(values, memo)`` with
    ``values`` the node values by node index and ``memo`` the operations already evaluated in this call (an operation
    that several paths read, as attention's ``qkv``, runs once); it calls ``modules``. A term of a sum, as a one-input
    edge ``(source, maps, names)`` is."""

    def __init__(self, sources: tuple, fn, modules: tuple, names: tuple):
        self.sources, self.fn, self.modules, self.names = sources, fn, modules, names

    def then(self, m: nn.Module, name: str) -> "_Joint":
        f = self.fn
        return _Joint(self.sources, lambda vals, memo: m(f(vals, memo)), _unique(self.modules + (m,)),
                      self.names + (name,))

    def edge(self) -> JointEdge:
        sources, f = self.sources, self.fn
        text = " → ".join(self.names[-6:])
        return JointEdge(sources, JointMap(lambda values: f(dict(zip(sources, values)), {}), self.modules, text),
                         self.modules, self.names)


def _unique(modules) -> tuple:
    return tuple({id(m): m for m in modules}.values())


def _plain(term) -> bool:
    """Whether a term is a node's value itself (an edge with no maps)."""
    return not isinstance(term, _Joint) and not term[1]


def _as_joint(expr: list) -> _Joint:
    """A sum of terms as one function of the union of their sources."""
    if len(expr) == 1 and isinstance(expr[0], _Joint):
        return expr[0]
    sources = tuple(dict.fromkeys(s for t in expr for s in (t.sources if isinstance(t, _Joint) else (t[0],))))
    fns = [t.fn if isinstance(t, _Joint) else _compose(t[0], t[1]) for t in expr]

    def fn(vals, memo):
        out = None
        for f in fns:
            v = f(vals, memo)
            out = v if out is None else out + v
        return out
    modules = [m for t in expr for m in (t.modules if isinstance(t, _Joint) else t[1])]
    names = [n for t in expr for n in (t.names if isinstance(t, _Joint) else t[2])]
    return _Joint(sources, fn, _unique(modules), tuple(names))


def _compose(source: int, maps: tuple):
    def fn(vals, memo):
        z = vals[source]
        for m in maps:
            z = m(z)
        return z
    return fn


class _Const:
    """A number known when the model is read (a size of a non-batch dimension, arithmetic on sizes)."""

    def __init__(self, value):
        self.value = value


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    out = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def _substitute(a, value):
    """``a`` (an fx argument: nodes, lists, tuples, dicts, slices, constants) with each node ``n`` replaced by
    ``value(n)``."""
    if isinstance(a, fx.Node):
        return value(a)
    if isinstance(a, (list, tuple)):
        out = [_substitute(v, value) for v in a]
        return out if isinstance(a, list) else tuple(out)
    if isinstance(a, dict):
        return {k: _substitute(v, value) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(*(_substitute(v, value) for v in (a.start, a.stop, a.step)))
    return a


class _Tracer(fx.Tracer):
    """fx's tracer, with the engine's units, activations and declared maps kept as leaves."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if getattr(m, "inferlearn_map", False) or getattr(m, "inferlearn_affine", False):
            return True
        if is_activation(m):
            return True
        return super().is_leaf_module(m, qualname)


def _is_linear(m: nn.Module) -> bool:
    """An affine map without offset (``m(u + v) = m(u) + m(v)``): distributes over the edges of a sum."""
    if isinstance(m, (Scale, Slot, Index, Reshape, nn.Flatten, nn.Unflatten, nn.AvgPool1d, nn.AvgPool2d,
                      nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
        return True
    if isinstance(m, Function):
        return m.linear
    if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return m.bias is None
    return False


class _Reader:
    """Walks a traced graph, keeping each tensor as a sum of edges ``[(source, maps, names), …]``."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule, shapes: dict, shared_nodes: bool = False):
        self.model, self.gm, self.shapes, self.shared_nodes = model, gm, shapes, shared_nodes
        self.nodes: list[Node] = []
        self.env: dict = {}
        self.calls: list[tuple[str, nn.Module]] = []   # every module call, in order
        self.who = type(model).__name__
        self.shaped = False   # whether a size of the input's non-batch dimensions was read

    def refuse(self, node: fx.Node, why: str, fix: str) -> None:
        raise ValueError(f"Cannot read {self.who} as a graph: node {node.name!r} ({_describe(node)}) {why}; {fix}")

    def new_node(self, expr: list, activation: nn.Module | None) -> list:
        units = units_of_module(activation) if activation is not None else None
        edges = tuple(t.edge() if isinstance(t, _Joint) else Edge(t[0], tuple(t[1]), tuple(t[2])) for t in expr)
        self.nodes.append(Node(edges, activation, units))
        return [(len(self.nodes), (), ())]

    def materialise(self, expr: list) -> list:
        """A sum (or anything with maps) becomes a node with a linear unit: its value node."""
        if len(expr) == 1 and _plain(expr[0]):
            return expr
        return self.new_node(expr, nn.Identity())

    def apply(self, expr: list, m: nn.Module, name: str) -> list:
        if len(expr) > 1 and not _is_linear(m):
            expr = self.materialise(expr)
        return [t.then(m, name) if isinstance(t, _Joint) else (t[0], t[1] + (m,), t[2] + (name,)) for t in expr]

    def constant(self, n: fx.Node):
        """The value of a constant node (a size of the input's non-batch dimensions); ``None`` otherwise."""
        v = self.env.get(n)
        return v.value if isinstance(v, _Const) else None

    def dim(self, node: fx.Node, tensor: fx.Node, i) -> object:
        """``x.shape[i]`` / ``x.size(i)``: the batch size for ``i = 0``, a constant for another dimension, ``x.shape``
        itself for ``i = None``."""
        if i is None:
            return ("size", tensor)
        if i == 0:
            return _BATCH
        shape = self.shapes.get(tensor)
        if not isinstance(i, int) or shape is None:
            self.refuse(node, "reads the input's shape", "use fixed shapes (nn.Flatten, x.flatten(1)) instead")
        self.shaped = True
        return _Const(shape[i])

    def joint(self, node: fx.Node, call, modules: tuple = ()) -> list:
        """The operation ``call`` (its arguments: the node's, with every traced tensor replaced by its value) as a
        joint map of every node value its tensor arguments read (module docstring)."""
        if node.target in _REFUSED:
            self.refuse(node, "is not differentiable, or is random", "the energy rules differentiate the model's "
                        "predictions at every inference step: move it out of the model (backprop takes any model)")
        refs = []

        def note(a):
            v = self.env.get(a)
            if isinstance(v, list):
                refs.append(a)
            elif v is not _BATCH and not isinstance(v, _Const):
                self.refuse(node, "computes with the input's shape", "use fixed shapes (x.flatten(1), -1) instead")
            return a
        fx.node.map_arg((node.args, node.kwargs), note)
        if not refs:
            self.refuse(node, "takes no tensor computed from the model's input", "wrap constants in a module")
        refs = list(dict.fromkeys(refs))
        for n in refs:   # a sum that enters a non-linear operation is a value node (as before a non-linear map)
            self.env[n] = self.materialise(self.env[n]) if len(self.env[n]) > 1 else self.env[n]
        joints = [_as_joint(self.env[n]) for n in refs]
        sources = tuple(dict.fromkeys(s for j in joints for s in j.sources))
        picks = [(n, j.fn) for n, j in zip(refs, joints)]
        args, kwargs = node.args, node.kwargs
        consts = {n: self.constant(n) for n in _arg_nodes(node) if isinstance(self.env.get(n), _Const)}

        def fn(vals, memo):
            if node in memo:
                return memo[node]
            got = {n: f(vals, memo) for n, f in picks}
            batch = next(iter(vals.values())).shape[0]
            value = lambda n: got[n] if n in got else consts[n] if n in consts else batch   # noqa: E731
            out = memo[node] = call(*_substitute(args, value), **_substitute(kwargs, value))
            return out
        name = node.target if node.op == "call_module" else node.name
        return [_Joint(sources, fn, _unique(tuple(m for j in joints for m in j.modules) + tuple(modules)),
                       tuple(dict.fromkeys(tuple(n for j in joints for n in j.names) + (name,))))]

    def tensor(self, node: fx.Node, arg) -> list:
        if isinstance(arg, fx.Node) and isinstance(self.env.get(arg), list):
            return self.env[arg]
        self.refuse(node, "takes an input that is not a tensor computed from the model's input",
                    "wrap constants in a module (or use an inferlearn_graph() method)")

    def read(self) -> list[Node]:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise ValueError(f"Cannot read {self.who} as a graph: its forward takes {len(placeholders)} inputs "
                             "(the engine needs exactly one, the batch); give it an inferlearn_graph() method")
        out = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = [(0, (), ())]
            elif node.op == "output":
                out = node
            elif node.op == "get_attr":
                self.refuse(node, "uses a tensor attribute of the model directly",
                            "put the computation in a module (e.g. nn.Linear) or give the model an inferlearn_graph() method")
            elif node.op == "call_module":
                self.env[node] = self.call_module(node)
            else:
                self.env[node] = self.call_function(node)
            if isinstance(self.env.get(node), list) and len(node.users) > 1 and (len(self.env[node]) > 1 or (
                    self.shared_nodes and node in self.shapes and _value_users(node) > 1)):
                self.env[node] = self.materialise(self.env[node])
        check_single_use(self.calls)   # shared weights: refused by name
        return self.finish(out)

    def call_module(self, node: fx.Node) -> list:
        m = self.gm.get_submodule(node.target)
        self.calls.append((node.target, m))
        if len(node.args) != 1 or node.kwargs or any(not isinstance(self.env.get(a), list) for a in node.args):
            return self.joint(node, m, (m,))   # several arguments (attention's q, k, v): one joint map
        x = self.tensor(node, node.args[0])
        if isinstance(m, nn.Identity) or (isinstance(m, DROPOUT_TYPES) and m.p == 0):
            return x   # (dropout with p > 0 is a map even in eval mode: the graph stays right when the mode changes)
        if getattr(m, "inferlearn_map", False) or getattr(m, "inferlearn_affine", False):
            return self.apply(x, m, node.target)
        if is_activation(m):
            return self.new_node(x, m)
        if is_map(m):
            return self.apply(x, m, node.target)
        if len(x) == 1:   # any other module (softmax, a library's attention): one map of one term
            return [x[0].then(m, node.target) if isinstance(x[0], _Joint) else (x[0][0], x[0][1] + (m,),
                                                                                 x[0][2] + (node.target,))]
        return self.joint(node, m, (m,))

    def call_function(self, node: fx.Node):
        t, args, kw = node.target, node.args, node.kwargs
        first = self.env.get(args[0]) if args and isinstance(args[0], fx.Node) else None
        if node.op == "call_method" and t == "size":
            return self.dim(node, args[0], args[1] if len(args) > 1 else kw.get("dim"))
        if t is getattr and len(args) == 2 and args[1] == "shape":
            return ("size", args[0])
        if t is operator.getitem and isinstance(first, tuple):
            return self.dim(node, first[1], args[1])
        constants = [self.env.get(a) for a in _arg_nodes(node)]
        if constants and all(isinstance(c, _Const) for c in constants):   # arithmetic on sizes: done now
            return _Const(_callable(node)(*_substitute(args, self.constant), **_substitute(kw, self.constant)))
        if isinstance(first, tuple) or first is _BATCH:
            self.refuse(node, "computes with the input's shape", "use fixed shapes (nn.Flatten, x.flatten(1)) instead")
        if t in _ACT_FUNCTIONS:
            return self.new_node(self.tensor(node, args[0]), _ACT_FUNCTIONS[t](args[1:], dict(kw)))
        if t in _ADD or t in _SUB:
            if "alpha" in kw or len(args) != 2:
                self.refuse(node, "adds with a factor", "scale one term instead (x + 0.5 * y)")
            a, b = self.tensor(node, args[0]), self.tensor(node, args[1])
            if t in _SUB:
                b = [(s, maps + (Scale(-1.0),), names + ("-",)) for s, maps, names in b]
            return a + b
        if t in _MUL or t in _DIV:
            a, b = (self.constant(v) if isinstance(self.env.get(v), _Const) else v for v in args[:2])
            if isinstance(a, (int, float)) and t in _MUL:
                a, b = b, a
            if isinstance(b, fx.Node) or isinstance(a, fx.Node) and not isinstance(self.env.get(a), list):
                return self.joint(node, _callable(node))   # a product of tensors (a gate): a joint map
            if not isinstance(b, (int, float)) or isinstance(b, bool) or not math.isfinite(b) or b == 0:
                self.refuse(node, "multiplies by something other than a non-zero number or a tensor",
                            "scale by a non-zero number, or multiply tensors")
            return self.apply(self.tensor(node, a), Scale(b if t in _MUL else 1.0 / b), node.name)
        if t in _CAT:
            return self.cat(node)
        if t is operator.getitem and self.shapes and args[0] not in self.shapes:
            return self.joint(node, operator.getitem)   # an element of a tuple (a module's several outputs)
        if t is operator.getitem:
            return self.index(node)
        if t in _RESHAPE:
            return self.reshape(node)
        if t in _PASS:
            return self.tensor(node, args[0])
        if t in _LINEAR_FUNCTIONS or t in _SMOOTH_FUNCTIONS:
            fn = getattr(torch.Tensor, t) if isinstance(t, str) else t
            m = Function(fn, args[1:], kw, linear=t in _LINEAR_FUNCTIONS)
            if t in ("mean", torch.mean) and not _keeps_batch(args[1:], kw):
                self.refuse(node, "averages over the batch dimension", "average over dimensions 1 and above")
            return self.apply(self.tensor(node, args[0]), m, node.name)
        return self.joint(node, _callable(node))   # matmul, softmax, transpose, …: a joint map

    def cat(self, node: fx.Node) -> list:
        parts = node.args[0]
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
        shapes = [self.shapes.get(p) for p in parts]
        if any(s is None for s in shapes):
            self.refuse(node, "concatenates tensors whose shapes are unknown", "call the rule with an input first")
        ndim = len(shapes[0])
        dim = dim + ndim if dim < 0 else dim
        if dim == 0:
            self.refuse(node, "concatenates along the batch dimension", "concatenate along dimension 1 or above")
        sizes = [s[dim] for s in shapes]
        total, expr, before = sum(sizes), [], 0
        for p, n in zip(parts, sizes):
            expr += self.apply(self.tensor(node, p), Slot(dim, before, total - before - n), node.name)
            before += n
        return expr

    def index(self, node: fx.Node) -> list:
        idx = node.args[1]
        idx = idx if isinstance(idx, tuple) else (idx,)
        if not idx or not (isinstance(idx[0], slice) and idx[0] == slice(None)) or not all(
                isinstance(i, (slice, int)) or i is Ellipsis for i in idx):
            self.refuse(node, "indexes the batch dimension or with tensors",
                        "slice the feature dimensions only (x[:, 3:7])")
        return self.apply(self.tensor(node, node.args[0]), Index(idx), node.name)

    def reshape(self, node: fx.Node) -> list:
        t, args, kw = node.target, node.args, node.kwargs
        x = self.tensor(node, args[0])
        shape = self.shapes.get(node)
        if t in ("flatten", torch.flatten):
            start = kw.get("start_dim", args[1] if len(args) > 1 else 0)
            end = kw.get("end_dim", args[2] if len(args) > 2 else -1)
            if start == 0:
                self.refuse(node, "flattens the batch dimension", "flatten from dimension 1 (x.flatten(1))")
            return self.apply(x, nn.Flatten(start, end), node.name)
        if t in ("unflatten", torch.unflatten):
            dim, sizes = (kw.get("dim", args[1] if len(args) > 1 else None), kw.get("sizes", args[2] if len(args) > 2
                                                                                    else None))
            if not isinstance(dim, int) or dim == 0 or shape is None:
                self.refuse(node, "unflattens the batch dimension (or an unknown shape)",
                            "unflatten a feature dimension (x.unflatten(1, (C, H, W))) after an input was seen")
            return self.apply(x, Reshape(shape[1:]), node.name)
        dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        dims = [self.constant(d) if isinstance(self.env.get(d), _Const) else d for d in dims]
        if not dims or not (dims[0] is _BATCH or dims[0] == -1 or (isinstance(dims[0], fx.Node)
                                                                  and self.env.get(dims[0]) is _BATCH)):
            self.refuse(node, "reshapes without keeping the batch dimension first",
                        "reshape as x.view(x.size(0), ...) or use nn.Flatten")
        rest = list(dims[1:])
        if any(not isinstance(d, int) for d in rest) or (dims[0] == -1 and -1 in rest):
            self.refuse(node, "reshapes to a shape computed at run time", "use fixed sizes")
        if shape is not None:
            rest = list(shape[1:])
        return self.apply(x, Reshape(rest), node.name)

    def finish(self, out: fx.Node) -> list[Node]:
        res = out.args[0]
        if not isinstance(res, fx.Node) or not isinstance(self.env.get(res), list):
            raise ValueError(f"Cannot read {self.who} as a graph: its forward must return one tensor computed "
                             "from its input (not a tuple or dict)")
        expr = self.env[res]
        L = len(self.nodes)
        if not (len(expr) == 1 and _plain(expr[0]) and expr[0][0] == L and L > 0):
            self.new_node(expr, None)
        return self.nodes


def _value_users(node: fx.Node) -> int:
    """How many operations read the tensor's values (not only its shape)."""
    return sum(1 for u in node.users if not ((u.op == "call_method" and u.target == "size") or (
        u.target is getattr and u.args[1:] == ("shape",))))


def _callable(node: fx.Node):
    """The function a ``call_function`` or ``call_method`` node calls, taking the node's arguments."""
    if node.op == "call_method":
        name = node.target
        return lambda self, *a, **k: getattr(self, name)(*a, **k)
    return node.target


def _keeps_batch(args, kw) -> bool:
    dim = kw.get("dim", args[0] if args else None)
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return dim is not None and all(isinstance(d, int) and d != 0 for d in dims)


def _describe(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"module {node.target}"
    t = node.target
    return f"{node.op.replace('_', ' ')} {getattr(t, '__name__', t)}"


def trace_graph(model: nn.Module, example: torch.Tensor | None = None) -> tuple[list[Node], bool]:
    """The nodes of ``model`` read by ``torch.fx`` (module docstring), and whether they depend on the input's
    shape (a concatenation: ``example``, one input batch, gives the sizes of its parts).

    Raises:
        ValueError: fx cannot trace the model, or a node is one the engine cannot use (the message names it).
    """
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:   # fx raises TraceError, TypeError, NotImplementedError, ... on dynamic code
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"Cannot read {type(model).__name__} as a graph: torch.fx cannot trace its forward "
                         f"({first}); remove data-dependent control flow, or give it an inferlearn_graph() method "
                         "(backprop and fenchel-bp take any model)") from None
    gm = fx.GraphModule(model, graph)
    shapes: dict = {}
    if example is not None:
        shapes = _shapes(gm, example[:1])
    reader = _Reader(model, gm, shapes)
    links = reader.read()
    if any(n.joint for n in links):   # a model with joint maps: a tensor read twice is a value node (no map run twice)
        reader = _Reader(model, gm, shapes, shared_nodes=True)
        links = reader.read()
    check_graph(model, links)
    return links, reader.shaped or any(n.target in _CAT for n in graph.nodes)


@torch.no_grad()
def _shapes(gm: fx.GraphModule, x: torch.Tensor) -> dict:
    """The shape of every traced tensor on input ``x`` (one row), by interpreting the graph."""
    shapes = {}

    class _Interp(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if torch.is_tensor(out):
                shapes[n] = tuple(out.shape)
            return out

    try:
        _Interp(gm).run(x)
    except Exception:   # a wrong input width: the rule's own forward pass reports it
        return {}
    return shapes
