"""DeepFacto at small scale: NMF between blocks, fine-tuned with block-ADMM, probed with linear SVMs.

Reproduces the *setup* of the paper's DeepFacto experiment (seed 003, §4.2) on MNIST, since LFWA and
the Inception-ResNet backbone are not available here:

1. pre-train a small conv net (Conv16-Pool-Conv32-Pool-Linear) on MNIST with back-propagation (Adam);
2. insert an NMF module of rank r on the 1568-d backbone output (after the second pooling) and a new
   linear head on the scores ``S``; warm-start the basis by NMF of the frozen backbone's output
   (the paper's "pre-train the NMF module with the backbone frozen"), then fine-tune backbone, NMF
   and head end to end with batch block-ADMM;
3. train linear SVMs on features of training images to predict Morpho-MNIST-like attributes that the
   network never saw (thickness, slant, width, height, each thresholded at its training median) and
   report test accuracy, for three feature sets:
   *activations* (un-factorised 1568-d backbone output of the pre-trained net), *NMF after training*
   (rank-r NMF fitted to those activations: the "prior work" baseline), *DeepFacto* (``S`` of the
   fine-tuned network, by test-time NNLS projection). Sparsity = fraction of exactly-zero scores.

Writes ``benchmarks/results/bench_deepfacto.md``. Run::

    python benchmarks/bench_deepfacto.py
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import balanced_accuracy_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.blocks import conv_net
from inferlearn.data import load_dataset
from inferlearn.experiments.morpho import ATTRIBUTES, binary_attributes, morpho_attributes
from inferlearn.admm.nmf import NMF

RESULTS = Path(__file__).parent / "results"


def probe(ftr, ltr, fte, lte) -> dict:
    out = {}
    for k in ATTRIBUTES:
        clf = make_pipeline(StandardScaler(), LinearSVC(C=0.1, max_iter=5000))
        clf.fit(ftr, ltr[k])
        out[k] = float(balanced_accuracy_score(lte[k], clf.predict(fte)))
    return out


def feats(fn, x, bs=1000):
    with torch.no_grad():
        return torch.cat([fn(x[a:a + bs]) for a in range(0, len(x), bs)]).numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-train", type=int, default=5000)
    ap.add_argument("--limit-test", type=int, default=2000)
    ap.add_argument("--probe-train", type=int, default=2000)
    ap.add_argument("--pretrain-epochs", type=int, default=2)
    ap.add_argument("--admm-epochs", type=int, default=3)
    ap.add_argument("--ranks", default="4,32,256")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("mnist")
    X = ds.train_x[:args.limit_train].reshape(-1, 1, 28, 28)
    Y = ds.train_y[:args.limit_train]
    Xt, Yt = ds.test_x[:args.limit_test].reshape(-1, 1, 28, 28), ds.test_y[:args.limit_test]
    a_tr, med = binary_attributes(morpho_attributes(X[:args.probe_train]))
    a_te, _ = binary_attributes(morpho_attributes(Xt), med)

    net = conv_net((16, 32), seed=0)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(args.pretrain_epochs):
        perm = torch.randperm(len(X), generator=g)
        for a in range(0, len(X), 128):
            idx = perm[a:a + 128]
            opt.zero_grad()
            F.cross_entropy(net(X[idx]), Y[idx]).backward()
            opt.step()
    with torch.no_grad():
        base_acc = float((net(Xt).argmax(1) == Yt).float().mean())
    backbone = net[:7]  # conv stages + Flatten: 1568 non-negative features
    act_tr, act_te = feats(backbone, X[:args.probe_train]), feats(backbone, Xt)
    rows = [("activations (1568-d, BP pre-trained)", "—", probe(act_tr, a_tr, act_te, a_te),
             float((act_te == 0).mean()), base_acc)]
    print(rows[-1], flush=True)
    Ztr = feats(backbone, X)
    for r in [int(v) for v in args.ranks.split(",")]:
        t0 = time.perf_counter()
        post = NMF(1568, r, seed=0)
        post.fit(torch.from_numpy(Ztr), iters=20, sweeps=10)
        s_tr, s_te = feats(post, torch.from_numpy(act_tr)), feats(post, torch.from_numpy(act_te))
        rows.append((f"NMF after training, r={r}", r, probe(s_tr, a_tr, s_te, a_te), float((s_te == 0).mean()),
                     float("nan")))
        print(rows[-1], time.perf_counter() - t0, flush=True)

        t0 = time.perf_counter()
        bb = copy.deepcopy(backbone)
        torch.manual_seed(0)
        blocks = [bb, NMF(1568, r, seed=0), torch.nn.Sequential(torch.nn.Linear(r, 10))]
        tr = BlockADMM(blocks, ADMMConfig(batch_size=128, lr=1e-3, beta=[20.0, 20.0], zeta=[0.025, 0.05],
                                          nmf_init_iters=20, nmf_sweeps=10, chunk_size=1000))
        tr.init_state(X, Y)
        # Warm start of the head on the initial scores (the backbone and NMF are fixed meanwhile).
        for _ in range(3):
            hopt = torch.optim.Adam(blocks[2].parameters(), 1e-2)
            for a in range(0, len(X), 128):
                hopt.zero_grad()
                F.cross_entropy(blocks[2](tr.Z[1][a:a + 128]), Y[a:a + 128]).backward()
                hopt.step()
        for _ in range(args.admm_epochs):
            m = tr.epoch()
        with torch.no_grad():
            acc = float((tr.predict(Xt).argmax(1) == Yt).float().mean())
        nmf = blocks[1]
        d_tr = feats(lambda x: nmf(bb(x)), X[:args.probe_train])
        d_te = feats(lambda x: nmf(bb(x)), Xt)
        rows.append((f"DeepFacto (block-ADMM), r={r}", r, probe(d_tr, a_tr, d_te, a_te), float((d_te == 0).mean()), acc))
        print(rows[-1], m, time.perf_counter() - t0, flush=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["# DeepFacto probe on MNIST (bench_deepfacto.py)", "",
             f"Command: `python benchmarks/bench_deepfacto.py --limit-train "
             f"{args.limit_train} --limit-test {args.limit_test} --probe-train {args.probe_train} --pretrain-epochs "
             f"{args.pretrain_epochs} --admm-epochs {args.admm_epochs} --ranks {args.ranks}`", "",
             f"Reduced setting (2 shared CPU cores): first {args.limit_train} MNIST training images for pre-training "
             f"({args.pretrain_epochs} epochs BP Adam) and block-ADMM fine-tuning ({args.admm_epochs} outer iterations, "
             "β = γ = 20, ζ_Z = 0.025 (Z feeding the NMF is solved exactly), ζ_S = 0.05, Adam lr 1e-3, head warm-started "
             f"3 epochs on the initial scores); linear SVMs (standardised, C = 0.1) trained on the first {args.probe_train} "
             f"training images, tested on the first {args.limit_test} test images. Attributes (Morpho-MNIST-like, "
             "`inferlearn.morpho`) are thresholded at the training medians; probe scores are *balanced* accuracies (chance = 0.5 even where ties at the median unbalance the classes). "
             "Sparsity: fraction of exactly-zero features on the test images. Digit acc: 10-class test accuracy of "
             "the network that produced the features.", "",
             "| features | rank | " + " | ".join(ATTRIBUTES) + " | mean | sparsity | digit acc |",
             "|---|---|" + "---|" * (len(ATTRIBUTES) + 3)]
    for name, r, p, sp, acc in rows:
        lines.append(f"| {name} | {r} | " + " | ".join(f"{p[k]:.3f}" for k in ATTRIBUTES) +
                     f" | {np.mean(list(p.values())):.3f} | {sp:.2f} | " + ("—" if acc != acc else f"{acc:.4f}") + " |")
    (RESULTS / "bench_deepfacto.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
