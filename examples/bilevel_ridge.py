"""Learn a regularisation weight by bilevel optimisation with an argmin layer (about 10 s).

Inner problem (training data):   w*(λ) = argmin_w ½‖X w − y‖² + (e^s / 2)‖w‖²,   λ = e^s
Outer problem (validation data): min_s ½‖X_val w*(λ) − y_val‖² / n_val

The argmin layer solves the inner problem (closed form: an unconstrained quadratic) and its backward
is the symmetric contrastive surrogate (``β``-nudged solves, no Hessian inverse). The script
compares the learned ``λ`` with a grid search over the validation loss and the surrogate's
gradient with implicit differentiation at the start.

Run:  python examples/bilevel_ridge.py
"""
import math

import torch

from inferlearn.bilevel import ArgminLayer, QuadraticEnergy

torch.manual_seed(0)
DT = torch.float64
n, n_val, d = 40, 400, 30
w_true = torch.randn(d, dtype=DT) * (torch.rand(d, dtype=DT) < 0.3)   # a few relevant features
X, X_val = torch.randn(n, d, dtype=DT), torch.randn(n_val, d, dtype=DT)
y = X @ w_true + 1.0 * torch.randn(n, dtype=DT)
y_val = X_val @ w_true + 1.0 * torch.randn(n_val, dtype=DT)


def val_loss(s: torch.Tensor, layer: ArgminLayer) -> torch.Tensor:
    Q = X.T @ X + torch.exp(s) * torch.eye(d, dtype=DT)     # E(w) = ½ wᵀQw − cᵀw
    c = (X.T @ y).unsqueeze(0)                              # one "sample": the weight vector
    w = layer(Q, c)[0]
    return 0.5 * (X_val @ w - y_val).pow(2).mean()


contrastive = ArgminLayer(QuadraticEnergy(), beta=1e-3, nudging="symmetric")
implicit = ArgminLayer(QuadraticEnergy(), backward="implicit")

grads = {}
for name, layer in (("contrastive", contrastive), ("implicit", implicit)):
    s = torch.tensor(0.0, dtype=DT, requires_grad=True)
    val_loss(s, layer).backward()
    grads[name] = float(s.grad)
print(f"d(val loss)/d log λ at λ = 1: contrastive {grads['contrastive']:.8f}, implicit {grads['implicit']:.8f}")

s = torch.tensor(0.0, dtype=DT, requires_grad=True)
opt = torch.optim.Adam([s], lr=0.1)
for step in range(150):
    opt.zero_grad()
    loss = val_loss(s, contrastive)
    loss.backward()
    opt.step()
    if step % 30 == 0:
        print(f"step {step:3d}  λ = {math.exp(s.item()):8.4f}  validation loss {loss.item():.5f}")

grid = torch.linspace(-6, 8, 281, dtype=DT)
with torch.no_grad():
    losses = torch.stack([val_loss(g, contrastive) for g in grid])
best = float(grid[losses.argmin()])
print(f"learned λ = {math.exp(s.item()):.4f} (validation loss {val_loss(s, contrastive).item():.5f}); "
      f"grid search λ = {math.exp(best):.4f} (validation loss {float(losses.min()):.5f}); "
      f"no regularisation (λ = 1e-6): {float(val_loss(torch.tensor(math.log(1e-6), dtype=DT), contrastive)):.5f}")
