"""Prototype: Z and dual updates per mini-batch inside the Θ pass (investigation only).

Usage: python benchmarks/investigations/bench_admm_interleaved.py gs|jacobi EPOCHS BETA ZETA
gs: per mini-batch, reverse-order Z steps with the current weights, then the Θ step, then the dual update.
jacobi: one forward/backward gives the Θ and Z gradients; both step from the same point; dual from that forward.
"""
import sys, torch, time
from inferlearn.admm import ADMMConfig, BlockADMM, _loss_sum, _sqnorm_rows
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.data import load_dataset
torch.set_num_threads(1)
variant = sys.argv[1]; E = int(sys.argv[2]); beta = float(sys.argv[3]); zeta = float(sys.argv[4])
ds = load_dataset("mnist"); X = ds.train_x[:10000].reshape(-1,1,28,28); Y = ds.train_y[:10000]
Xt, Yt = ds.test_x[:5000].reshape(-1,1,28,28), ds.test_y[:5000]
net = mlp("784-256-256-10", seed=0)
tr = BlockADMM(split_sequential(net), ADMMConfig(batch_size=128, lr=1e-3, beta=beta, zeta=zeta))
tr.init_state(X, Y)
T = tr.T
def lag(zs, y, idx):
    tot = 0; outs = []
    for t in range(1, T+1):
        out = tr.blocks[t-1](zs[t-1]); outs.append(out)
        if t == T: tot = tot + _loss_sum("cross-entropy", out, y)
        else: tot = tot + 0.5*beta*_sqnorm_rows(zs[t] - out + tr._u(t, idx)).sum()
    return tot, outs
for ep in range(E):
    t0 = time.perf_counter()
    perm = torch.randperm(len(X), generator=tr.generator)
    for a in range(0, len(X), 128):
        idx = perm[a:a+128]; y = Y[idx]; B = len(idx)
        zs = [X[idx]] + [tr._get(t, idx) for t in range(1, T)]
        if variant == "gs":  # reverse-order Z steps on the batch with current weights, then Θ, then dual
            for t in range(T-1, 0, -1):
                with torch.no_grad(): target = tr.blocks[t-1](zs[t-1]) - tr._u(t, idx)
                z = zs[t].requires_grad_(True)
                nxt = tr.blocks[t](z)
                obj = 0.5*beta*(z-target).pow(2).sum() + (_loss_sum("cross-entropy", nxt, y) if t+1 == T else 0.5*beta*_sqnorm_rows(zs[t+1]-nxt+tr._u(t+1, idx)).sum())
                g, = torch.autograd.grad(obj, z); zs[t] = (z - zeta*g).detach()
            tr.optimizer.zero_grad(set_to_none=True)
            tot, outs = lag(zs, y, idx); (tot/B).backward()
            tr.optimizer.step()
            with torch.no_grad():
                for t in range(1, T):
                    tr.Z[t-1][idx] = zs[t]
                    tr.U[t-1][idx] = tr._u(t, idx) + zs[t] - tr.blocks[t-1](zs[t-1])
        else:  # jacobi: one forward/backward, Θ and Z gradient steps from the same point, dual from pre-step outputs
            zv = [zs[0]] + [z.requires_grad_(True) for z in zs[1:]]
            tr.optimizer.zero_grad(set_to_none=True)
            tot, outs = lag(zv, y, idx)
            gz = torch.autograd.grad(tot, zv[1:], retain_graph=True)
            (tot/B).backward()
            tr.optimizer.step()
            with torch.no_grad():
                for t in range(1, T):
                    znew = zv[t].detach() - zeta*gz[t-1]
                    tr.Z[t-1][idx] = znew
                    tr.U[t-1][idx] = tr._u(t, idx) + zv[t].detach() - outs[t-1].detach()
    dt = time.perf_counter()-t0
    with torch.no_grad(): te = (net(Xt).argmax(1)==Yt).float().mean().item(); trf = (net(X).argmax(1)==Y).float().mean().item(); accZ = (tr.blocks[-1](tr.Z[-1]).argmax(1)==Y).float().mean().item()
    print(f"{variant} ep{ep+1} test {te:.3f} train-fwd {trf:.3f} train-f3(Z) {accZ:.3f} {dt:.2f}s", flush=True)
