"""Run by ``tests/admm/test_admm_parallel.py`` under the elastic launcher (2 or 3 processes on loopback).

Trains a 3-block float64 MLP with :class:`BlockParallelADMM` and, in every process, the one-process
:class:`BlockADMM` with the same (Jacobi) schedule from the same start; rank 0 writes the largest
relative differences of weights, Z, U, predictions and metrics as JSON to ``argv[1]``, and checks
that a gathered checkpoint loads back (into both trainers) and continues identically.
"""
import copy
import sys

import torch

from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.admm.parallel import BlockParallelADMM
from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.distributed import join
from oracle_helpers import finish_worker


def rel(a, b):
    return float((a - b).norm() / max(b.norm(), 1e-300))


def main(out: str, adaptive: bool) -> None:
    torch.set_num_threads(1)
    group = join("cpu", timeout_s=60)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(70, 16, generator=gen, dtype=torch.float64)
    Y = torch.randint(0, 3, (70,), generator=gen)
    cfg = ADMMConfig(batch_size=16, lr=1e-2, beta=[2.0, 1.0], zeta=0.2, primal_steps=2, z_schedule="jacobi",
                     chunk_size=32, adaptive=adaptive, fused_optimizer=False)
    net = mlp("16-8-8-3", seed=1, dtype=torch.float64)
    ref = BlockADMM(split_sequential(copy.deepcopy(net)), cfg)
    par = BlockParallelADMM(split_sequential(net), cfg, group)
    ref.init_state(X, Y)
    par.init_state(X, Y)
    errors = {}
    for _ in range(3):
        m_ref, m_par = ref.epoch(), par.epoch()
        for key, v in m_ref.items():
            if key.startswith(("residual", "rel_residual", "beta", "admm_objective")):
                errors[f"metric {key}"] = max(errors.get(f"metric {key}", 0), abs(m_par[key] - v) / max(abs(v), 1e-12))
    errors["predict"] = rel(par.predict(X), ref.predict(X))
    state = par.state_dict()
    if group.is_main:
        want = ref.state_dict()
        for t in range(2):
            errors[f"Z{t + 1}"] = rel(state["Z"][t], want["Z"][t])
            errors[f"U{t + 1}"] = rel(state["U"][t], want["U"][t])
        for b, (s_par, s_ref) in enumerate(zip(state["blocks"], want["blocks"])):
            for k in s_ref:
                errors[f"block{b + 1}.{k}"] = rel(s_par[k], s_ref[k])
    # resume: every rank loads rank 0's gathered checkpoint; one more epoch on both must agree
    box = [state]
    torch.distributed.broadcast_object_list(box, src=0)
    net2 = mlp("16-8-8-3", seed=5, dtype=torch.float64)   # other weights: the checkpoint must overwrite them
    again = BlockParallelADMM(split_sequential(net2), cfg, group)
    again.init_state(X, Y)
    again.load_state_dict(box[0])
    again.epoch()
    ref.epoch()
    errors["resumed predict"] = rel(again.predict(X), ref.predict(X))
    finish_worker(group, errors, out)


if __name__ == "__main__":
    main(sys.argv[1], adaptive=len(sys.argv) > 2 and sys.argv[2] == "adaptive")
