"""Diagnose batch block-ADMM per epoch (investigation; not part of the library).

Usage: python benchmarks/investigations/bench_admm_diag.py EPOCHS [key=value ...]
keys: ADMMConfig fields, lrK=V (block K's learning rate), zfirst=1 (a Z sweep before the first Θ pass), alpha=A (damped dual U += A r).
Prints test accuracy, training accuracy of the last block on the stored Z_2 vs on the plain forward pass,
how well the Θ pass fits its targets Z_t + U_t, |U|/|Z|, how far Z moves per epoch, relative residuals.
"""
import sys, torch
from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.data import load_dataset
torch.set_num_threads(1)
ov = dict(kv.split("=") for kv in sys.argv[2:])
ov = {k: ([float(x) for x in v.split(",")] if "," in v else float(v) if "." in v or "e" in v else int(v)) for k, v in ov.items()}
ds = load_dataset("mnist"); X = ds.train_x[:10000].reshape(-1,1,28,28); Y = ds.train_y[:10000]
Xt, Yt = ds.test_x[:5000].reshape(-1,1,28,28), ds.test_y[:5000]
net = mlp("784-256-256-10", seed=0)
cfg = ADMMConfig(**{"batch_size":128, "lr":1e-3, "beta":1.0, "zeta":0.5, **{k:v for k,v in ov.items() if k in ADMMConfig.__dataclass_fields__}})
tr = BlockADMM(split_sequential(net), cfg)
tr.init_state(X, Y)
for i, g in enumerate(tr.optimizer.param_groups):  # lr1=, lr2=, lr3=: per-block learning rates
    g['lr'] = float(ov.get(f'lr{i + 1}', g['lr']))
if ov.get("zfirst"):
    for t in range(tr.T-1, 0, -1): tr._z_update(t)
f1, f2, f3 = tr.blocks
for ep in range(int(sys.argv[1])):
    tr._theta_pass()
    with torch.no_grad():
        F1 = f1(X); F2 = f2(tr.Z[0]); Ff = f2(F1)
        fit1 = ((tr.Z[0]+tr.U[0]-F1).norm()/tr.Z[0].norm()).item(); fit2 = ((tr.Z[1]+tr.U[1]-F2).norm()/tr.Z[1].norm()).item()
        accZ = (f3(tr.Z[1]).argmax(1)==Y).float().mean().item(); accF = (f3(Ff).argmax(1)==Y).float().mean().item()
        accF2 = (f3(F2).argmax(1)==Y).float().mean().item()
        un = [(u.norm()/z.norm()).item() for u,z in zip(tr.U, tr.Z)]
    Zb = [z.clone() for z in tr.Z]; Ub = [u.clone() for u in tr.U]
    res, zn = tr._fused_z_dual_sweep() if tr.fused else None
    a = ov.get('alpha', 1.0)
    for u, ub in zip(tr.U, Ub): u.copy_(ub + a * (u - ub))
    dz = [((z-zb).norm()/zb.norm()).item() for z,zb in zip(tr.Z, Zb)]
    with torch.no_grad(): te = (net(Xt).argmax(1)==Yt).float().mean().item()
    tr.iteration += 1
    print(f"ep{ep+1} test {te:.3f} | trainacc f3(Z2) {accZ:.3f} f3(f2(Z1)) {accF2:.3f} fwd {accF:.3f} | fit-after-theta {fit1:.3f} {fit2:.3f} | |U|/|Z| {un[0]:.3f} {un[1]:.3f} | dZ {dz[0]:.3f} {dz[1]:.3f} | rel res {res[0]/zn[0]:.3f} {res[1]/zn[1]:.3f}", flush=True)
