"""The built-in benchmark protocols (:data:`PROTOCOLS`, ``inferlearn benchmark --list``) and :func:`load_protocol`
(a built-in name or a JSON file), built from the types of :mod:`~inferlearn.benchmark.protocols` and PCX's recipes
(:mod:`~inferlearn.benchmark.pcx_recipes`)."""
from __future__ import annotations

import json
from pathlib import Path

from .pcx_recipes import PCX_VGG5, PCX_VGG7, pcx_variants
from .protocols import PCX, Budget, Protocol, Reference, Variant
from .validate import check_protocol_data


def load_protocol(name: str) -> Protocol:
    """A protocol by name (:data:`PROTOCOLS`) or from a JSON file (``path/to/protocol.json``).

    Raises:
        ValueError: an unknown name, a missing or invalid file (one line).
    """
    if name in PROTOCOLS:
        return PROTOCOLS[name]
    if name.endswith(".json") or Path(name).is_file():
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"Protocol file {name} does not exist; give a protocol name ({', '.join(PROTOCOLS)}) "
                             "or a JSON file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"Protocol file {name} is not valid JSON ({exc})") from None
        check_protocol_data(data, f"Protocol file {name}", Protocol, Variant, Reference, Budget)   # the schema first
        try:
            return Protocol.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"Protocol file {name}: {exc}") from None
    raise ValueError(f"Unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)} (inferlearn benchmark --list) "
                     "or give a JSON file")


# ---------------------------------------------------------------------------------------------------------------
# The protocols. Learning-rate grids are a factor ~3 apart around each rule's recommended rate for the optimiser.

_ADAM_LR = (3e-4, 1e-3, 3e-3)
_PC_ADAM_LR = (3e-5, 1e-4, 3e-4)
#: ePC's error step on the conv protocols: the small-step regime (1e-5, the point VGG-5's edge extension reached), the
#: default 1e-4 and ten times larger; 1e-5 is on the grid at every rate because at high rates 1e-4 can diverge
#: where 1e-5 does not (VGG-7 at 3e-3), and an edge extension only explores around the chosen point
_EPC_ETAS = (1e-5, 1e-4, 1e-3)
#: PC on VGG-5: the two upper points of the MLP grid (3e-5 learns too slowly for a few epochs), to halve the search
_PC_CONV_LR = (1e-4, 3e-4)
#: BP and ePC on the conv protocols: around PCX's AdamW rates (2.6e-4 to 2.9e-4) and three and ten times above
_CONV_BP_LR = (3e-4, 1e-3, 3e-3)
#: PC's value-node rate on the conv protocols: PCX-CE's as its code applies it (0.0147/128) and as its file states it
_PC_CONV_ETAS = (1.4708110891388754e-2 / 128, 1.4708110891388754e-2)


def _mlp_variants() -> tuple:
    """The MLP rows: every rule of the PCX benchmark that inferlearn has, plus the lifted/auxiliary ones; cheapest
    first among the PCX rows (iPC, a weight update at every inference step, last), so that a partial table has them."""
    return (
        Variant("bp", "backprop", "BP (squared error)", search={"lr": _ADAM_LR}),
        Variant("bp-ce", "backprop", "BP (cross-entropy)", {"loss": "cross-entropy"}, search={"lr": _ADAM_LR}),
        Variant("fenchel-bp", "fenchel-bp", "Fenchel BP", search={"lr": _ADAM_LR}),
        Variant("pc-se", "pc", "PC, squared error", search={"lr": _PC_ADAM_LR, "rule.step_size": (0.05, 0.1)}),
        Variant("pc-ce", "pc", "PC, cross-entropy", {"output": "ce"},
                search={"lr": _PC_ADAM_LR, "rule.step_size": (0.05, 0.1)}),
        Variant("epc-se", "epc", "ePC, squared error (K = 5)", search={"lr": _ADAM_LR}),
        Variant("epc-ce", "epc", "ePC, cross-entropy (K = 5)", {"output": "ce"}, search={"lr": _ADAM_LR}),
        Variant("pc-centred", "pc", "PC, centred nudging (CE)", {"output": "ce", "nudging": "symmetric"},
                search={"lr": _PC_ADAM_LR}),
        Variant("eqprop-ce", "eqprop", "EqProp (CE, centred)",
                {"nudge": "loss", "loss": "cross-entropy", "nudging": "symmetric"}, search={"lr": _ADAM_LR}),
        Variant("ipc", "pc", "incremental PC (iPC)", train={"optimizer": "sgd", "momentum": 0.0},
                search={"rule.weight_step": (0.01, 0.03, 0.1)}),
        Variant("contrastive", "contrastive", "contrastive (J1)", search={"lr": _ADAM_LR}),
        Variant("mac", "mac", "MAC", search={"lr": _ADAM_LR}),
        Variant("lpom", "lpom", "LPOM", search={"lr": _ADAM_LR}),
    )


_MLP_NOTES = ("Our settings, not PCX's: ReLU units (every rule here accepts them; PCX tuned the activation per method), "
              "Adam on the weights (iPC: plain SGD at its weight step, which is iPC), inferlearn's PC defaults (T = 20). "
              "No weight decay, schedule or augmentation (TrainConfig's weight_decay, lr_schedule and augment set them "
              "in a protocol's `train`).")


def _mlp(name: str, data: str, summary: str) -> Protocol:
    return Protocol(name=name, summary=summary, data=data, arch="pcx-mlp", variants=_mlp_variants(),
                    train={"act": "relu", "epochs": 10, "batch_size": 64, "optimizer": "adam"},
                    val_size=5000, select="last", extend=2, cpu=Budget("cpu"), full_device="cpu", notes=_MLP_NOTES)


def _conv_variants(model: str, recipes: tuple, origin: str) -> tuple:
    """The conv protocols' rows: our searched rows of BP, PC and ePC (cheapest first), then PCX's recipes."""
    return (
        Variant("bp", "backprop", "BP (squared error)", search={"lr": _CONV_BP_LR}),
        Variant("bp-ce", "backprop", "BP (cross-entropy)", {"loss": "cross-entropy"}, search={"lr": _CONV_BP_LR}),
        Variant("epc-ce", "epc", "ePC, cross-entropy (K = 5)", {"output": "ce"},
                search={"lr": _CONV_BP_LR, "rule.step_size": _EPC_ETAS}),
        Variant("pc-ce-momentum", "pc", "PC, cross-entropy, momentum 0.05 on the value nodes (T = 8)",
                {"steps": 8, "output": "ce", "inference_optimizer": "momentum", "inference_momentum": 0.05},
                search={"lr": _PC_CONV_LR, "rule.step_size": _PC_CONV_ETAS}),
    ) + pcx_variants(model, recipes, origin)


def _pc_at_vgg5_choice(max_seeds: int | None = None) -> Variant:
    """``pc-ce-momentum`` unsearched, at the point VGG-5's search chose (AdamW 3e-4, value-node step 0.0147 per
    sample): on the deeper models one PC run costs 10-15 BP runs, so their state-PC row transfers VGG-5's choice."""
    return Variant("pc-ce-momentum-vgg5", "pc", "PC, cross-entropy, momentum 0.05 on the value nodes (T = 8), at "
                   "VGG-5's searched lr 3e-4 and step 0.0147",
                   {"steps": 8, "output": "ce", "inference_optimizer": "momentum", "inference_momentum": 0.05,
                    "step_size": _PC_CONV_ETAS[1]}, train={"lr": _PC_CONV_LR[1]}, max_seeds=max_seeds)


_CONV_TRAIN = {"act": "relu", "epochs": 50, "batch_size": 128, "optimizer": "adamw", "weight_decay": 5e-4,
               "lr_schedule": "cosine", "standardize": "on", "augment": "crop-flip"}
_OURS = ("Our rows (`bp`, `bp-ce`, `epc-ce`, `pc-ce-momentum`): ReLU, AdamW with weight decay 5e-4 on a per-epoch cosine, the rate "
         "(and PC's and ePC's inference rate) searched on the validation split; the grids contain PCX's rates. ")
_DATA = ("Inputs standardised per channel with the training split's statistics (PCX: fixed CIFAR constants) and "
         "augmented by 4-pixel crops and flips, as PCX's loader. Colour CIFAR-10 read with --allow-unverified is the "
         "lossy JPEG-derived development copy (the data line says which copy ran).")
_CONV_NOTES = (_OURS + "PCX's rows (`pcx-…`): exactly the hyper-parameters of PCX's published files (activation, energy, "
               "T, value-node SGD rate and momentum, AdamW rate and weight decay, β per epoch), with PCX's per-step "
               "schedule (warmup-cosine: 1.1× over 10 % of the steps, cosine to 0.1×) and the weight gradient × 1/β of "
               "its nudged recipes (nudging=target); each PC recipe twice, the value-node rate per sample as the file "
               "states it and divided by the batch as PCX's code applies it. PCX's iPC recipe has no row: PCX's iPC "
               "steps the weights by AdamW at every inference step, inferlearn's by plain SGD. " + _DATA)
_RESNET_NOTES = (_OURS + "`epc-ce-small` is ePC in its small-step regime (η = 1e-5, the point VGG-5's and VGG-7's "
                 "ePC searches reach) at BP-CE's searched rate, not searched: one ePC run costs about seven BP runs; "
                 "`pc-ce-momentum-vgg5` is `pc-ce-momentum` at the point VGG-5's search chose, not searched "
                 "(one run takes 50 minutes of one core). The "
                 "ResNet-18 has no BatchNorm (bn=off); PCX publishes no ResNet-18 recipe. " + _DATA)


def _vit_variants() -> tuple:
    """The transformer rows: BP, Fenchel BP, ePC in its small-step regime (η ≤ 1e-4: on a transformer larger error steps
    overshoot, LayerNorm and attention giving the network a large gain), the same with its hidden gradients rescaled
    to back-propagation's scale, and PC at T = 8."""
    return (
        Variant("bp-ce", "backprop", "BP (cross-entropy)", {"loss": "cross-entropy"}, search={"lr": _ADAM_LR}),
        Variant("fenchel-bp", "fenchel-bp", "Fenchel BP", search={"lr": _ADAM_LR}),
        Variant("epc-ce", "epc", "ePC, cross-entropy (K = 5)", {"output": "ce"},
                search={"lr": (1e-3, 3e-3), "rule.step_size": (1e-6, 1e-5, 1e-4)}),
        # the value-node step too: on a transformer the state energy's curvature grows with training (LayerNorm
        # divides by the residual stream's spread) until steps of 0.05 make inference diverge and PC's update
        # collapses after the first epoch (results page: predictive coding on a transformer)
        Variant("pc-ce", "pc", "PC, cross-entropy (T = 8)", {"steps": 8, "output": "ce"},
                search={"lr": (3e-4, 1e-3), "rule.step_size": (0.01, 0.03, 0.1)}),
        # hidden gradients c_K = Kη times BP's, near AdamW's ε at η ≤ 1e-5: the same row with them rescaled by 1/c_K
        # measures whether that scale matters (results page: it does not, under AdamW)
        Variant("epc-ce-rescaled", "epc", "ePC, cross-entropy (K = 5), hidden gradients ÷ c_K", {"output": "ce", "rescale": True},
                search={"lr": (1e-3, 3e-3), "rule.step_size": (1e-6, 1e-5)}),
    )


_VIT_TRAIN = {"epochs": 5, "batch_size": 128, "optimizer": "adamw", "weight_decay": 5e-4, "lr_schedule": "cosine"}
_VIT_NOTES = ("Pre-norm blocks, GELU MLPs, AdamW with weight decay 5e-4 on a per-epoch cosine. The inference rules read "
              "the model by fx tracing: value nodes after the patch embedding, after each attention block (one joint "
              "map of the residual stream), after each MLP's activation and after each MLP block (docs: Graphs).")


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    _mlp("mlp-mnist", "mnist", "PCX's MLP (784-128-128-128-10) on MNIST, every rule; the full budget runs on a CPU"),
    _mlp("mlp-fashion", "fashion-mnist", "PCX's MLP (784-128-128-128-10) on Fashion-MNIST, every rule; the full budget "
         "runs on a CPU"),
    Protocol(
        name="vgg5-cifar10", summary="PCX's VGG-5 on colour CIFAR-10 (50 epochs at full width: a GPU; --budget cpu: "
        "width ×1/8, 5 epochs; --budget smoke: width ×1/16, 3 epochs)",
        data="cifar10", arch="vgg5",
        variants=(   # cheapest first, so that a partial table has the rows every comparison needs
            Variant("bp", "backprop", "BP (squared error)", search={"lr": _ADAM_LR}),
            Variant("fenchel-bp", "fenchel-bp", "Fenchel BP", search={"lr": _ADAM_LR}),
            Variant("pc-se", "pc", "PC, squared error (T = 7)", {"steps": 7}, search={"lr": _PC_CONV_LR}),
            Variant("pc-ce", "pc", "PC, cross-entropy (T = 7)", {"steps": 7, "output": "ce"}, search={"lr": _PC_CONV_LR}),
            # the error step too: at AdamW 3e-3 the network's gain grows until 5 steps of 1e-3 overshoot (the
            # small-step regime needs η λ_max(1 + JᵀJ) ≪ 1), while 1e-4 stays on BP's direction (docs: methods/epc)
            Variant("epc-se", "epc", "ePC, squared error (K = 5)", search={"lr": _ADAM_LR, "rule.step_size": _EPC_ETAS}),
            Variant("epc-ce", "epc", "ePC, cross-entropy (K = 5)", {"output": "ce"},
                    search={"lr": _ADAM_LR, "rule.step_size": _EPC_ETAS}),
            Variant("pc-centred", "pc", "PC, centred nudging (CE, T = 7)",
                    {"steps": 7, "output": "ce", "nudging": "symmetric"}, search={"lr": _PC_CONV_LR}),
            Variant("ipc", "pc", "incremental PC (iPC, T = 7)", {"steps": 7}, train={"optimizer": "sgd", "momentum": 0.0},
                    search={"rule.weight_step": (0.001, 0.003)}),   # 0.01 and 0.03 diverge in the first epoch
            Variant("eqprop-ce", "eqprop", "EqProp (CE, centred)",
                    {"nudge": "loss", "loss": "cross-entropy", "nudging": "symmetric"}, search={"lr": _ADAM_LR}),
            # the lifted energy reads average pooling (a linear map), not max pooling: EqProp on that VGG-5, with the
            # linearised CE nudge and one rate (BP's choice on this protocol) so that 3 seeds fit a CPU budget
            Variant("bp-avg", "backprop", "BP (squared error), VGG-5 with average pooling",
                    train={"arch": "vgg5:pool=avg", "lr": 3e-3}),
            Variant("eqprop-avg", "eqprop", "EqProp (CE linearised, centred), VGG-5 with average pooling",
                    {"nudge": "linear", "loss": "cross-entropy", "nudging": "symmetric"},
                    train={"arch": "vgg5:pool=avg", "lr": 3e-3}),
            Variant("contrastive", "contrastive", "contrastive (J1)", search={"lr": _ADAM_LR}),
            Variant("mac", "mac", "MAC, Z-step from the forward pass", {"warm_start": False}, search={"lr": _ADAM_LR}),
            Variant("lpom", "lpom", "LPOM", search={"lr": _ADAM_LR}),
        ) + tuple(v for v in _conv_variants("vgg5", PCX_VGG5, "VGG-5 CIFAR-10") if v.name in ("bp-ce", "pc-ce-momentum")
                  or v.name.startswith("pcx-")),
        train={"act": "relu", "epochs": 50, "batch_size": 128, "optimizer": "adamw", "weight_decay": 5e-4,
               "lr_schedule": "cosine", "standardize": "on", "augment": "crop-flip"},
        val_size=5000, select="last", extend=2, cpu=Budget("cpu", width=0.125, epochs=0.1),
        smoke=Budget("smoke", width=0.0625, epochs=0.06), full_device="cuda",
        references=(Reference("bp", 89.43, "BP with the squared error"),
                    Reference("pc-centred", 89.47, "PCX's best PC variant, centred nudging"),
                    Reference("ipc", 85.51, "incremental PC")),
        source=PCX + "; PCX also reports PC's time per epoch at 4.65× BP's at T = 7 on a GPU",
        notes=("VGG-5 uses max pooling, which the lifted energies (contrastive, EqProp, LPOM) cannot read: those rows "
               "are skipped with the rule's reason. EqProp runs instead on VGG-5 with average pooling (a linear map the "
               "lifted energy reads), beside BP on that model: the linearised cross-entropy nudge and BP's rate, "
               "unsearched, since one EqProp epoch costs tens of BP epochs at the CPU budget (the time column). Inputs are standardised per channel and augmented (4-pixel crops, "
               "flips), weights trained by AdamW (weight decay 5e-4) on a cosine schedule, as in PCX's recipe; the "
               "exact rates, decay and schedule are ours (searched or fixed here), not PCX's. Colour CIFAR-10 read with "
               "--allow-unverified is the lossy JPEG-derived development copy (the data line says which copy ran). "
               "MAC runs with warm_start=false: its per-image coordinates would be 237,568 floats per image at full "
               "width (48 GB for 50,000 images in float32, in memory and in every checkpoint; 5.9 GB at --budget cpu's width 1/8, 3.0 GB at --budget smoke's 1/16).")),
    Protocol(
        name="vgg7-cifar10", summary="PCX's VGG-7 on colour CIFAR-10: our searched BP/PC/ePC rows beside PCX's VGG-7 "
        "recipes (--budget cpu: width ×1/8, 5 epochs)",
        data="cifar10", arch="vgg7", variants=_conv_variants("vgg7", PCX_VGG7, "VGG-7 CIFAR-100") + (_pc_at_vgg5_choice(),),
        train=_CONV_TRAIN,
        val_size=5000, extend=2, cpu=Budget("cpu", width=0.125, epochs=0.1), smoke=Budget("smoke", width=0.0625, epochs=0.02),
        full_device="cuda", baseline="bp-ce", notes=_CONV_NOTES + " PCX publishes VGG-7 recipes for CIFAR-100 and Tiny ImageNet, not "
        "CIFAR-10: the pcx- rows use the CIFAR-100 files. `pc-ce-momentum-vgg5` is `pc-ce-momentum` at the point VGG-5's "
        "search chose (lr 3e-4, step 0.0147), not searched."),
    Protocol(
        name="resnet18-cifar10", summary="ResNet-18 (CIFAR-style, no BatchNorm) on colour CIFAR-10: BP, PC, ePC "
        "(--budget cpu: width ×1/8, 5 epochs)",
        data="cifar10", arch="resnet18", variants=_conv_variants("resnet18", (), "") + (
            Variant("epc-ce-small", "epc", "ePC, cross-entropy (K = 5), η = 1e-5 at BP-CE's searched rate 3e-3",
                    {"output": "ce", "step_size": 1e-5}, train={"lr": 3e-3}), _pc_at_vgg5_choice()),
        train=_CONV_TRAIN,
        val_size=5000, extend=2, cpu=Budget("cpu", width=0.125, epochs=0.1), smoke=Budget("smoke", width=0.0625, epochs=0.02),
        full_device="cuda", baseline="bp-ce", notes=_RESNET_NOTES),
    Protocol(
        name="vit-mnist", summary="A 2-block vision transformer on MNIST (7×7 patches): BP, Fenchel BP, PC, ePC; a quick "
        "check of the transformer rows on a CPU", data="mnist", arch="vit:depth=2,width=32,heads=2,patch=7,pool=mean,act=gelu",
        variants=_vit_variants() + (
            # rescaled ePC at η = 1e-6 in float32 and float64: float32 keeps only the leading bits of e = z − μ there
            # (benchmarks/results/epc_vit_adam_eps.md), float64 all of them; one seed each (a float64 epoch is slow)
            Variant("epc-ce-rescaled-f32", "epc", "ePC, cross-entropy (K = 5), hidden gradients ÷ c_K, η = 1e-6, "
                    "float32", {"output": "ce", "rescale": True, "step_size": 1e-6}, train={"lr": 3e-3}, max_seeds=1),
            Variant("epc-ce-rescaled-f64", "epc", "ePC, cross-entropy (K = 5), hidden gradients ÷ c_K, η = 1e-6, "
                    "float64", {"output": "ce", "rescale": True, "step_size": 1e-6}, train={"lr": 3e-3, "dtype": "float64"},
                    max_seeds=1),),
        train=_VIT_TRAIN, val_size=5000, extend=1, cpu=Budget("cpu"),
        smoke=Budget("smoke", width=1.0, epochs=0.2), baseline="bp-ce", notes=_VIT_NOTES),
    Protocol(
        name="vit-cifar10", summary="A 4-block vision transformer on colour CIFAR-10 (4×4 patches, class token): BP, "
        "Fenchel BP, PC, ePC (--budget cpu: width ×1/2, 5 epochs)", data="cifar10",
        arch="vit:depth=4,width=64,heads=4,patch=4,pool=cls,act=gelu", variants=_vit_variants() + (
            # at --budget cpu one PC or ePC epoch costs 6-8 BP epochs: these rows run at BP-CE's searched rate with
            # the inference step vit-mnist's searches chose, unsearched
            Variant("epc-ce-small", "epc", "ePC, cross-entropy (K = 5), η = 1e-5 at BP-CE's searched rate 1e-3",
                    {"output": "ce", "step_size": 1e-5}, train={"lr": 1e-3}, max_seeds=1),
            Variant("pc-ce-small", "pc", "PC, cross-entropy (T = 8), step 0.01 at BP-CE's searched rate 1e-3",
                    {"steps": 8, "output": "ce", "step_size": 0.01}, train={"lr": 1e-3}, max_seeds=1)),
        train={**_VIT_TRAIN, "epochs": 50, "standardize": "on", "augment": "crop-flip"}, val_size=5000, extend=1,
        cpu=Budget("cpu", width=0.5, epochs=0.1), smoke=Budget("smoke", width=0.5, epochs=0.02), baseline="bp-ce",
        full_device="cuda", notes=_VIT_NOTES + " At --budget cpu one PC or ePC epoch costs 6–8 BP epochs (the time "
        "column), so `epc-ce-small` and `pc-ce-small` run unsearched on one seed: BP-CE's searched rate with the "
        "inference step that vit-mnist's searches chose (ePC η = 1e-5, PC 0.01). " + _DATA),
)}
