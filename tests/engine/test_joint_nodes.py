"""Nodes whose prediction is a function of several nodes (joint maps: attention, gates), read by fx tracing or
the graph protocol.

Oracles: predictive coding and ePC written by hand with autograd on a pre-norm attention block (value nodes after
the embedding, after the attention block, after the MLP's activation and after the pooled residual stream); the
same graph written with joint maps and with sums of one-input maps (the form every earlier graph has) giving the
same ``.grad`` for every rule that reads both; back-propagation through the traced joint maps equal to autograd of
the model.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.engine.graph import AFFINE, DIFFERENTIABLE, JointEdge, NodeSpec, read_graph
from inferlearn.rules import make_rule

DT = torch.float64


class Attention(nn.Module):
    """Multi-head self-attention written as users write it (shape reads, chunk, transpose, matmul, softmax)."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return self.proj((a @ v).transpose(1, 2).flatten(2))


class Block(nn.Module):
    """Tokens → a pre-norm transformer block (attention, GELU MLP) → mean pooling → a linear head."""

    def __init__(self, seed=0, d=8, tokens=5, width=4, classes=3):
        super().__init__()
        torch.manual_seed(seed)
        self.tokens, self.width = tokens, width
        self.embed, self.ln1, self.att = nn.Linear(width, d), nn.LayerNorm(d), Attention(d)
        self.ln2, self.fc1, self.fc2, self.head = nn.LayerNorm(d), nn.Linear(d, 16), nn.Linear(16, d), nn.Linear(d, classes)
        with torch.no_grad():   # non-trivial LayerNorm parameters: their gradients are checked too
            for ln in (self.ln1, self.ln2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.2, 0.2)
        self.to(DT)

    def forward(self, x):
        h = self.embed(x.unflatten(1, (self.tokens, self.width)))
        h = h + self.att(self.ln1(h))
        h = h + self.fc2(F.gelu(self.fc1(self.ln2(h))))
        return self.head(h.mean(1))

    # the value nodes as the tracer places them, each given the errors added to its prediction (ePC) or not (PC)
    def nodes(self, x, errors=(0.0, 0.0, 0.0, 0.0)):
        h = self.embed(x.unflatten(1, (self.tokens, self.width))) + errors[0]
        s = h + self.att(self.ln1(h)) + errors[1]
        g = F.gelu(self.fc1(self.ln2(s))) + errors[2]
        p = (s + self.fc2(g)).mean(1) + errors[3]
        return [h, s, g, p]

    def predictions(self, x, zs):
        h, s, g, _ = zs
        return [self.embed(x.unflatten(1, (self.tokens, self.width))), h + self.att(self.ln1(h)),
                F.gelu(self.fc1(self.ln2(s))), (s + self.fc2(g)).mean(1)]


def _data(n=6, features=20, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g, dtype=DT), torch.randint(0, classes, (n,), generator=g)


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    info = rule.backward(model, x, labels)
    return [p.grad.clone() for p in model.parameters()], info


def _loss(y, output):
    return (lambda o: 0.5 * (o - y).pow(2).sum()) if output == "se" else (lambda o: -(y * torch.log_softmax(o, 1)).sum())


def _few_line_pc(model, x, y, steps, eta, output):
    loss = _loss(y, output)

    def energy(zs):
        own = sum(0.5 * (z - p).pow(2).sum() for z, p in zip(zs, model.predictions(x, zs)))
        return own + loss(model.head(zs[-1]))

    with torch.no_grad():
        zs = [z.clone().requires_grad_(True) for z in model.nodes(x)]
    for _ in range(steps):
        grads = torch.autograd.grad(energy(zs), zs)
        with torch.no_grad():
            for z, g in zip(zs, grads):
                z -= eta * g
    model.zero_grad(set_to_none=True)
    (energy([z.detach() for z in zs]) / x.shape[0]).backward()
    return [p.grad.clone() for p in model.parameters()], [z.detach() for z in zs]


def _few_line_epc(model, x, y, steps, eta, output):
    loss = _loss(y, output)
    with torch.no_grad():
        es = [torch.zeros_like(z, requires_grad=True) for z in model.nodes(x)]
    for _ in range(steps):
        energy = 0.5 * sum(e.pow(2).sum() for e in es) + loss(model.head(model.nodes(x, es)[-1]))
        grads = torch.autograd.grad(energy, es)
        with torch.no_grad():
            for e, g in zip(es, grads):
                e -= eta * g
    with torch.no_grad():
        zs = model.nodes(x, es)
    state = sum(0.5 * (z - p).pow(2).sum() for z, p in zip(zs, model.predictions(x, zs))) + loss(model.head(zs[-1]))
    model.zero_grad(set_to_none=True)
    (state / x.shape[0]).backward()
    return [p.grad.clone() for p in model.parameters()], zs


def test_an_attention_block_is_read_with_value_nodes_after_each_block():
    """Guards the documented placement: the embedding, the residual stream after attention (one joint map), the
    MLP's activation, the pooled stream after the MLP; and the graph's forward equal to the model's."""
    model = Block()
    x, _ = _data()
    graph = read_graph(model, DIFFERENTIABLE, "pc", example=x)
    assert [n.sources for n in graph.nodes] == [(0,), (1, 1), (2,), (2, 3), (4,)]
    assert [n.joint for n in graph.nodes] == [False, True, False, False, False]
    joint = [e for e in graph.nodes[1].edges if isinstance(e, JointEdge)]
    assert len(joint) == 1 and "att.qkv" in joint[0].names and "att.proj" in joint[0].names
    zs, _ = graph.forward_all(x)
    torch.testing.assert_close(zs[-1], model(x), rtol=1e-13, atol=1e-13)


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")   # 10 steps: a trajectory, not the minimum
@pytest.mark.parametrize("output", ["se", "ce"])
def test_pc_on_an_attention_block_equals_few_line_autograd_pc(output):
    """Guards a joint map's vector–Jacobian product (to the stream node through q, k and v), the value-node
    trajectory and the envelope weight gradient (LayerNorm, qkv, projection) of predictive coding."""
    model = Block(seed=1)
    x, labels = _data(seed=2)
    y = F.one_hot(labels, 3).to(DT)
    ref, ref_nodes = _few_line_pc(model, x, y, steps=10, eta=0.1, output=output)
    mine, info = _grads(make_rule("pc", {"steps": 10, "step_size": 0.1, "output": output}), model, x, labels)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for a, b in zip(info.extras["hidden"], ref_nodes, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("output", ["se", "ce"])
def test_epc_on_an_attention_block_equals_few_line_autograd_epc(output):
    """Guards the errors' injection after a joint map and the reverse pass through attention."""
    model = Block(seed=3)
    x, labels = _data(seed=4)
    y = F.one_hot(labels, 3).to(DT)
    ref, ref_nodes = _few_line_epc(model, x, y, steps=6, eta=0.1, output=output)
    mine, info = _grads(make_rule("epc", {"steps": 6, "step_size": 0.1, "output": output}), model, x, labels)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for a, b in zip(info.extras["hidden"], ref_nodes, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["backprop", "fenchel-bp"])
def test_backprop_and_fenchel_bp_through_joint_maps_equal_autograd(name):
    model = Block(seed=5)
    x, labels = _data(seed=6)
    mine, _ = _grads(make_rule(name, {"beta": 1e-7} if name == "fenchel-bp" else {}), model, x, labels)
    model.zero_grad(set_to_none=True)
    (0.5 * (model(x) - F.one_hot(labels, 3).to(DT)).pow(2).sum() / x.shape[0]).backward()
    for a, p in zip(mine, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-8)


class _Gate(nn.Module):
    """``v = W_v x``, ``u = relu(W_u x)``: the product ``sigmoid(W_g u) ⊙ v`` reads two nodes (a gated unit)."""

    def __init__(self, joint: bool, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.u, self.v, self.g, self.out = nn.Linear(6, 5), nn.Linear(6, 5), nn.Linear(5, 5), nn.Linear(5, 3)
        self.ru, self.rv, self.joint = nn.ReLU(), nn.Tanh(), joint
        self.to(DT)

    def forward(self, x):
        return self.out(torch.sigmoid(self.g(self.ru(self.u(x)))) * self.rv(self.v(x)))


class _Sums(nn.Module):
    """One residual block written with the graph protocol twice: as sums of one-input maps, and with each node's
    pre-activation one joint map of all its sources (the same function)."""

    def __init__(self, joint: bool, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a, self.b, self.c, self.out = nn.Linear(6, 5), nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 3)
        self.r1, self.r2, self.r3, self.joint = nn.Tanh(), nn.GELU(), nn.Tanh(), joint
        self.to(DT)

    def forward(self, x):
        h = self.r1(self.a(x))
        u = self.r2(self.b(h))
        return self.out(self.r3(self.c(u) + h))

    def inferlearn_graph(self):
        third = NodeSpec([((2, 1), _Pair(self.c))], self.r3) if self.joint else NodeSpec([(2, self.c), (1, ())], self.r3)
        return [NodeSpec([(0, self.a)], self.r1), NodeSpec([(1, self.b)], self.r2), third, NodeSpec([(3, self.out)])]


class _Pair(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, u, h):
        return self.c(u) + h


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("name,opts", [("pc", {"steps": 8}), ("epc", {"steps": 5}), ("mac", {}),
                                       ("fenchel-bp", {}), ("backprop", {})])
def test_a_joint_node_gives_the_same_grad_as_the_sum_of_one_input_maps(name, opts):
    """Guards the general node form against the special case every earlier graph uses: the same function written
    as a joint map of two nodes gives the same gradients (float64, 1e-10)."""
    x, labels = _data(features=6, seed=7)
    sums, joint = _Sums(False, seed=8), _Sums(True, seed=8)
    assert not any(n.joint for n in read_graph(sums).nodes) and read_graph(joint).nodes[2].joint
    a, _ = _grads(make_rule(name, opts), sums, x, labels)
    b, _ = _grads(make_rule(name, opts), joint, x, labels)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_a_gated_unit_reads_two_nodes_and_trains_by_pc():
    model = _Gate(True, seed=9)
    x, labels = _data(features=6, seed=10)
    graph = read_graph(model, DIFFERENTIABLE, "pc", example=x)
    assert graph.nodes[-1].joint and set(graph.nodes[-1].sources) == {2, 3}
    grads, _ = _grads(make_rule("pc", {"steps": 20, "step_size": 0.1}), model, x, labels)
    bp, _ = _grads(make_rule("backprop"), model, x, labels)
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in grads]),
                                                torch.cat([g.flatten() for g in bp]), dim=0)
    assert cos > 0.9, float(cos)


class _LibraryAttention(nn.Module):
    """A user's model around ``nn.MultiheadAttention`` (a module called with three arguments, returning a tuple)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.embed, self.att = nn.Linear(4, 8), nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)
        self.to(DT)

    def forward(self, x):
        h = self.embed(x.unflatten(1, (5, 4)))
        h = h + self.att(h, h, h, need_weights=False)[0]
        return self.head(h.mean(1))


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("name", ["pc", "epc", "mac"])
def test_library_attention_is_a_joint_map_and_every_rule_fills_every_grad(name):
    model = _LibraryAttention()
    x, labels = _data(seed=12)
    graph = read_graph(model, DIFFERENTIABLE, name, example=x)
    assert any(n.joint for n in graph.nodes)
    grads, _ = _grads(make_rule(name), model, x, labels)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["contrastive", "eqprop", "lpom", "lifted-j0", "lifted-fenchel"])
def test_lifted_rules_refuse_a_joint_node_in_one_line_naming_it(name):
    model = Block()
    x, labels = _data()
    with pytest.raises(ValueError, match=r"cannot use node 2 \(.*att\.qkv.*non-affine function") as err:
        make_rule(name).backward(model, x, labels)
    assert "\n" not in str(err.value)


class _Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(20, 3), nn.Linear(20, 3)

    def forward(self, x):
        return self.a(x) * self.b(x).detach()


@pytest.mark.parametrize("model,match", [(_Detached(), r"node 'detach' .*not differentiable, or is random")])
def test_operations_inference_cannot_differentiate_are_refused_in_one_line(model, match):
    x, labels = _data()
    with pytest.raises(ValueError, match=match) as err:
        make_rule("pc").backward(model.to(DT), x, labels)
    assert "\n" not in str(err.value)
