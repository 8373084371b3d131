"""PCX's published hyper-parameter files as benchmark rows: :class:`PCXRecipe` (one file), the VGG-5 and VGG-7 recipes,
and :func:`pcx_variants`, the rows that run each recipe exactly (PCX's schedule, both readings of its value-node rate).

References:
    Pinchetti et al., *Benchmarking predictive coding networks -- made simple* (2024, arXiv:2407.01163); the files
    under ``examples/s4_1_discriminative_mode/hps/`` of github.com/liukidar/pcx at commit ``c722834``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .protocols import Variant


@dataclass(frozen=True)
class PCXRecipe:
    """One of PCX's published hyper-parameter files (``examples/s4_1_discriminative_mode/hps/MODEL/DATA/*.yaml`` at
    commit ``c722834`` of github.com/liukidar/pcx): the method, the activation, the energy, ``T``, the value nodes'
    SGD rate and momentum, AdamW's rate and weight decay, and β per epoch (PCX's ``beta_factor (beta + beta_ir e)``,
    or the centred recipe's list), trained on PCX's schedule (warm-up to 1.1× over 10 % of the steps, cosine to 0.1×)."""

    name: str
    label: str
    act: str
    ce: bool
    w_lr: float
    wd: float
    steps: int = 0          # 0: back-propagation
    x_lr: float = 0.0
    x_momentum: float = 0.0
    betas: tuple = ()       # β by epoch of PCX's nudged recipes; () for β = 1 (the clamp)


def pcx_betas(beta: float, factor: float, increment: float, epochs: int = 50) -> tuple:
    """β per epoch as PCX's ``PC.py`` computes it: ``factor (β + increment e)``, set to 1 once it reaches 1 and — as
    PCX's code does — to 1 again once a negative recipe passes −1."""
    return tuple(1.0 if abs(b) >= 1.0 else round(b, 10)
                 for b in (factor * (beta + increment * e) for e in range(epochs)))


#: PCX's VGG-5 CIFAR-10 files. Its iPC file has no row: PCX's iPC steps the weights by AdamW at every inference step,
#: inferlearn's iPC by plain SGD steps of its ``weight_step``
PCX_VGG5 = (
    PCXRecipe("bp-se", "BP-SE", "gelu", False, 2.788215086724204e-4, 1.1081592082589031e-4),
    PCXRecipe("bp-ce", "BP-CE", "gelu", True, 2.942494542760219e-4, 1.003434259988122e-5),
    PCXRecipe("pc-se", "PC-SE", "gelu", False, 2.657691155688603e-4, 6.6559627972820395e-3, 7, 2.348681827141059e-2, 0.3),
    PCXRecipe("pc-ce", "PC-CE", "gelu", True, 2.641020393177285e-4, 1.2107509557065504e-5, 8, 1.4708110891388754e-2, 0.05),
    PCXRecipe("pc-pn", "PC, positive nudging", "gelu", False, 2.9968925891952494e-4, 3.728852110891977e-5, 7,
              3.623356587254243e-2, 0.1, pcx_betas(0.32297201469734277, 1.0, 0.02)),
    PCXRecipe("pc-nn", "PC, negative nudging", "gelu", False, 2.61833244376427e-4, 8.992487435200682e-4, 7,
              2.8016192698375384e-2, 0.5, pcx_betas(0.17877062530418192, -1.0, 0.02)),
    PCXRecipe("pc-cn", "PC, centred nudging", "gelu", False, 2.2176352986601758e-4, 6.584549981050529e-4, 7,
              2.89108138224975e-2, 0.1, tuple(0.9 if c == "+" else -0.9 for c in   # the signs of VGG5_PC-CN_CIFAR10_beta.json
                                              "+++++-++---++---+------+-+---++----------+------")),
)
#: PCX's VGG-7 files: PCX publishes VGG-7 recipes for CIFAR-100 and Tiny ImageNet only; these are the CIFAR-100 ones
PCX_VGG7 = (
    PCXRecipe("bp-se", "BP-SE", "gelu", False, 2.492820278734172e-4, 3.3529077390445286e-5),
    PCXRecipe("bp-ce", "BP-CE", "hard-tanh", True, 1.3293220201776088e-4, 1.1361686420755476e-3),
    PCXRecipe("pc-se", "PC-SE", "leaky-relu", False, 1.8942597048071067e-4, 7.968501243194622e-4, 12,
              2.1020497754927873e-2, 0.35),
    PCXRecipe("pc-ce", "PC-CE", "hard-tanh", True, 1.1102395763121963e-4, 3.4191542161885526e-4, 11,
              2.0272225800985682e-2, 0.45),
    PCXRecipe("pc-pn", "PC, positive nudging", "gelu", False, 1.2243874591360667e-4, 1.835199911169501e-5, 11,
              5.038798558206877e-2, 0.4, pcx_betas(0.1, 1.0, 0.0)),
    PCXRecipe("pc-nn", "PC, negative nudging", "gelu", False, 1.163737981593612e-4, 6.065019239474804e-4, 9,
              7.185961963616658e-2, 0.85, pcx_betas(0.1, -1.0, 0.02)),
    PCXRecipe("pc-cn", "PC, centred nudging", "gelu", False, 2.836859624555198e-4, 2.6954734803245856e-4, 11,
              2.59850534184893e-2, 0.5, (0.15, 0.17, -0.19, 0.21, 0.23, 0.25, 0.27, -0.29, -0.31, 0.33, -0.35, 0.37,
                                         -0.39, -0.41, -0.43, 0.45, 0.47, -0.49, 0.51, -0.53, 0.55, 0.57, 0.59, -0.61,
                                         0.63, -0.65, -0.67, 0.69, -0.71, -0.73, -0.75, -0.77, 0.79, 0.81, -0.83, 0.85,
                                         -0.87, -0.89, 0.91, -0.93, -0.95, 0.97, 0.99, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0,
                                         -1.0)),
)
#: PCX's batch: its value-node gradient is the batch mean (``pmean``), so its step acts per sample as rate / 128
PCX_BATCH = 128


def pcx_variants(model: str, recipes: tuple, origin: str) -> tuple:
    """A row at exactly each PCX recipe (``origin`` names the files): a back-propagation recipe once (and ePC at it,
    ``pcx-epc-se``/``-ce``: PCX has no ePC), a PC recipe twice — the value-node rate per sample as the file states it (``pcx-NAME``), and divided by the batch as PCX's
    published code applies it (``pcx-NAME-b``: ``pmean`` over the batch gives each value node 1/B of its gradient)."""
    out = []
    for r in recipes:
        train = {"arch": f"{model}:act={r.act}", "optimizer": "adamw", "lr": r.w_lr, "weight_decay": r.wd,
                 "lr_schedule": "warmup-cosine"}
        if not r.steps:
            out.append(Variant(f"pcx-{r.name}", "backprop", f"{r.label}, PCX's {origin} recipe ({r.act})",
                               {"loss": "cross-entropy"} if r.ce else {}, train=train))
            # PCX has no ePC recipe; ePC's small-step regime is back-propagation's, so BP's recipe is its own
            out.append(Variant(f"pcx-epc-{r.name[3:]}", "epc", f"ePC (K = 5, η = 1e-4) at PCX's {origin} {r.label} "
                               f"recipe ({r.act})", {"output": "ce"} if r.ce else {}, train=train))
            continue
        options = {"steps": r.steps, "inference_optimizer": "momentum", "inference_momentum": r.x_momentum,
                   **({"output": "ce"} if r.ce else {}),
                   **({"nudging": "target", "beta_schedule": ",".join(repr(b) for b in r.betas)} if r.betas else {})}
        for suffix, rate, how in (("", r.x_lr, f"value nodes {r.x_lr:.3g} per sample"),
                                  ("-b", r.x_lr / PCX_BATCH, f"value nodes {r.x_lr:.3g}/{PCX_BATCH} per sample, as "
                                                            "PCX's code applies it")):
            out.append(Variant(f"pcx-{r.name}{suffix}", "pc", f"{r.label}, PCX's {origin} recipe, T = {r.steps}, {how} "
                               f"({r.act})", {**options, "step_size": rate}, train=train))
    return tuple(out)
