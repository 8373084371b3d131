"""The model zoo (``--arch vgg5``, ``resnet20:bn=eval``, ``resmlp:param=mupc``, ...).

Oracles: published parameter counts (ResNet-20 269,722; CIFAR ResNet-18 11,173,962) and closed-form counts
from the layer sizes of the papers, written here independently of the model code; ``torch.fx`` tracing
replayed against the module; μPC's scalings from jpc's ``_get_param_scalings``.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.fx
from torch import nn

from inferlearn.models import (ZOO, EvalBatchNorm2d, ResidualMLP, build_model, check_arch, resnet18, resnet20, vgg5,
                               vgg7)
from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig

MNIST, CIFAR = ((1, 28, 28), 10), ((3, 32, 32), 10)

# every zoo model, small enough to run in a fraction of a second
SMALL = {
    "pcx-mlp": "pcx-mlp:width=16",
    "vgg5": "vgg5:width=1/16",
    "vgg7": "vgg7:width=1/16,pool=avg",
    "resnet20": "resnet20:width=0.25",
    "resnet18": "resnet18:width=1/16,bn=eval",
    "resmlp": "resmlp:depth=4,width=16,param=mupc",
    "vit": "vit:depth=1,width=8,heads=2,patch=4",
}
IMAGE_BUILDERS = {"vgg5": vgg5, "vgg7": vgg7, "resnet20": resnet20, "resnet18": resnet18}


def build(arch, shape_classes=CIFAR, act="relu", seed=0):
    shape, n_classes = shape_classes
    return build_model(arch, act, math.prod(shape), n_classes, shape, seed=seed)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_table_covers_the_zoo():
    """Guards against a zoo model added without tests below."""
    assert set(SMALL) == set(ZOO)


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("data", [MNIST, CIFAR], ids=["mnist", "cifar"])
def test_every_zoo_model_builds_from_its_arch_string_and_fits_the_data(name, data):
    """Flat rows (the library's data) and images both give one row of class scores per sample."""
    shape, n_classes = data
    model = build(SMALL[name], data)
    flat = torch.randn(3, math.prod(shape))
    assert model(flat).shape == (3, n_classes)
    if name in IMAGE_BUILDERS:
        options = ZOO[name].parse_options(SMALL[name].partition(":")[2])
        model = IMAGE_BUILDERS[name](shape, n_classes, flat_input=False, **options)
    assert model(flat.reshape(3, *shape)).shape == (3, n_classes)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_zoo_model_traces_with_torch_fx(name):
    """The graph engine reads models through fx: a trace must succeed and compute the same function."""
    model = build(SMALL[name]).eval()
    traced = torch.fx.symbolic_trace(model)
    x = torch.randn(4, 3 * 32 * 32)
    torch.testing.assert_close(traced(x), model(x))


def conv(c_in, c_out, k=3, bias=True):
    return c_in * c_out * k * k + (c_out if bias else 0)


def resnet_count(stages, c_in, n_classes, bn, shortcut):
    """Parameters of a CIFAR ResNet from its layer sizes: stem, two 3×3 convolutions per block, a shortcut
    where the shape changes (none for option A, 1×1 conv for B), BN's γ, β per channel, the classifier."""
    norm = 2 if bn else 0
    c = stages[0][0]
    total = conv(c_in, c, bias=not bn) + norm * c
    for s, (channels, blocks) in enumerate(stages):
        for b in range(blocks):
            total += conv(c, channels, bias=not bn) + conv(channels, channels, bias=not bn) + 2 * norm * channels
            if (s > 0 and b == 0) and shortcut == "b":
                total += conv(c, channels, k=1, bias=not bn) + norm * channels
            c = channels
    return total + c * n_classes + n_classes


def vgg_count(stages, c_in, spatial, n_classes):
    total, c = 0, c_in
    for channels in stages:
        total += conv(c, channels)
        c = channels
    return total + c * spatial * n_classes + n_classes


@pytest.mark.parametrize("arch, expected", [
    ("pcx-mlp", (784 * 128 + 128) + 2 * (128 * 128 + 128) + 128 * 10 + 10),   # PCX's 784-128-128-128-10
    ("resnet20:bn=eval", 269_722),                      # He et al.'s "0.27M"
    ("resnet18:bn=eval", 11_173_962),                   # the CIFAR ResNet-18's 11.2M
])
def test_parameter_counts_match_the_published_ones(arch, expected):
    data = MNIST if arch == "pcx-mlp" else CIFAR
    assert n_params(build(arch, data)) == expected


@pytest.mark.parametrize("arch, expected", [
    ("vgg5", vgg_count([128, 256, 512, 512], 3, 2 * 2, 10)),
    ("vgg7", vgg_count([128, 128, 256, 256, 512, 512], 3, 1, 10)),
    ("vgg5:width=1/8", vgg_count([16, 32, 64, 64], 3, 2 * 2, 10)),
    ("resnet20", resnet_count([(16, 3), (32, 3), (64, 3)], 3, 10, bn=False, shortcut="a")),
    ("resnet20:shortcut=b,bn=eval", resnet_count([(16, 3), (32, 3), (64, 3)], 3, 10, bn=True, shortcut="b")),
    ("resnet20:width=0.5", resnet_count([(8, 3), (16, 3), (32, 3)], 3, 10, bn=False, shortcut="a")),
    ("resnet18:width=0.25", resnet_count([(16, 2), (32, 2), (64, 2), (128, 2)], 3, 10, bn=False, shortcut="b")),
    ("resmlp:depth=5,width=64", 3072 * 64 + 4 * 64 * 64 + 64 * 10),    # no biases
    ("resmlp:depth=5,width=64,plain,param=mupc", 3072 * 64 + 4 * 64 * 64 + 64 * 10),
])
def test_parameter_counts_match_the_closed_form(arch, expected):
    assert n_params(build(arch)) == expected


def test_resnet20_counts_match_on_mnist_shaped_inputs_too():
    """Grey 28×28 images change only the stem (one input channel); the global pooling absorbs the size."""
    assert n_params(build("resnet20:bn=eval", MNIST)) == resnet_count([(16, 3), (32, 3), (64, 3)], 1, 10, True, "a")


def test_vgg_pads_small_images_to_the_papers_layer_sizes():
    """28×28 inputs give the classifier PCX's 512·2·2 (VGG-5) and 512 (VGG-7) inputs, not fewer or none."""
    assert build("vgg5", MNIST)[-1].in_features == 512 * 2 * 2
    assert build("vgg7", MNIST)[-1].in_features == 512
    assert build("vgg5", ((3, 64, 64), 200))[-1].in_features == 512 * 4 * 4   # larger images: larger classifier


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_same_seed_gives_the_same_weights(name):
    """Whatever the state of torch's global generator: the seed alone decides the weights."""
    torch.manual_seed(1)
    a = build(SMALL[name], seed=3)
    torch.manual_seed(2)
    b, c = build(SMALL[name], seed=3), build(SMALL[name], seed=4)
    for (ka, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), ka
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_backprop_fills_the_grad_of_every_parameter(name):
    model = build(SMALL[name])
    x, labels = torch.randn(5, 3 * 32 * 32), torch.randint(0, 10, (5,))
    info = make_rule("backprop").backward(model, x, labels)
    assert math.isfinite(info.loss)
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


def assert_gradients_equal_float64(model, x, labels, threads: int) -> None:
    """``model``'s float32 cross-entropy gradients at ``threads`` threads equal float64 autograd's on a copy."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.nn.functional.cross_entropy(model(x), labels).backward()
    finally:
        torch.set_num_threads(before)
    ref = copy.deepcopy(model).double()
    ref.zero_grad()
    torch.nn.functional.cross_entropy(ref(x.double()), labels).backward()
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5 * q.grad.abs().max().item(),
                                   msg=pname)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_narrow_resnets_weight_gradients_equal_float64_autograd(threads):
    """The ResNet-18 at width 1/16 has strided 1×1 shortcuts on 4 channels, whose channels-last backward oneDNN's
    AVX2 kernel crashes on (1 thread) or gets wrong (more): the model stays NCHW and its float32 weight gradients
    equal float64 autograd's at either thread count, while the wider one stays channels-last."""
    from inferlearn.models.build import strided_1x1_conv_on_few_channels

    narrow, wide = build(SMALL["resnet18"]), build("resnet18:width=1/8,bn=off")
    assert strided_1x1_conv_on_few_channels(narrow) is not None and strided_1x1_conv_on_few_channels(wide) is None
    assert all(p.is_contiguous() for p in narrow.parameters())
    assert not narrow.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in wide.parameters() if p.dim() == 4)
    x, labels = torch.randn(6, 3 * 32 * 32, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 10
    assert_gradients_equal_float64(narrow, x, labels, threads)


@pytest.mark.parametrize("builder, channels", [("strided_1x1_channels_last", 3), ("strided_1x1_channels_last_gray", 1)])
def test_a_users_channels_last_model_on_oneDNNs_faulty_kernel_is_moved_to_nchw_and_gets_float64s_gradient(builder,
                                                                                                       channels):
    """A builder's channels-last model with a strided 1×1 convolution on 3 channels (oneDNN's faulty kernel) is
    moved to NCHW with a warning naming the layer, and its gradients at 2 threads then equal float64 autograd's.
    (At these 8×8 images the faulty kernel happens to be right; at 32×32 it can hang, so the test checks the move.)"""
    from inferlearn import InferlearnWarning
    from inferlearn.models import build_model

    with pytest.warns(InferlearnWarning, match=r"convolution '2' .*oneDNN#6035.*moved to NCHW"):
        model = build_model(f"bad_models:{builder}", "relu", channels * 64, 10, (channels, 8, 8))
    assert all(p.stride() == torch.empty(p.shape).stride() for p in model.parameters())   # NCHW strides
    x = torch.randn(16, channels * 64, generator=torch.Generator().manual_seed(0))
    assert_gradients_equal_float64(model, x, torch.arange(16) % 10, threads=2)


@pytest.mark.parametrize("arch, message", [
    ("vgg6", "Unknown architecture 'vgg6': expected MLP widths"),
    ("vgg6:width=2", "Unknown architecture 'vgg6:width=2'"),
    ("vgg5:depth=3", "Unknown option 'depth' for vgg5; choose from width, pool, act"),
    ("vgg5:pool=median", "Invalid vgg5 option pool='median': expected one of max, avg"),
    ("vgg5:width=0", "Invalid vgg5 option width='0': expected a positive channel multiplier"),
    ("vgg5:width=abc", "Invalid vgg5 option width='abc'"),
    ("vgg5:act=swish", "Invalid vgg5 option act='swish': expected one of relu, hard-tanh"),
    ("vgg5:width=1,width=2", "Option 'width' given twice"),
    ("vgg5:width", "Option 'width' of vgg5 needs a value"),
    ("vgg5:,", "Unknown option"),
    ("resnet20:bn=sync", "Invalid resnet20 option bn='sync': expected one of off, eval, train"),
    ("resnet18:shortcut=c", "expected one of a, b"),
    ("resmlp:param=ntk", "Invalid resmlp option param='ntk': expected one of sp, mupc"),
    ("resmlp:depth=2.5", "Invalid resmlp option depth='2.5': expected a positive integer"),
    ("resmlp:scale=-1", "Invalid resmlp option scale='-1': expected a positive number or 1/sqrt(L)"),
    ("resmlp:plain=maybe", "Invalid resmlp option plain='maybe'"),
    ("resmlp:nodes=edges", "expected one of stream, units"),
])
def test_bad_names_options_and_values_are_refused_in_one_line(arch, message):
    """At config time (check_arch, TrainConfig) and at build time, with the value and the choices."""
    for call in (lambda: check_arch(arch), lambda: TrainConfig(arch=arch), lambda: build(arch)):
        with pytest.raises(ValueError) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["784-64-10", "conv:16-32/64", "mypackage.models:build", "my_models:build", "vgg5",
                                  "VGG5:Width=0.5,pool=AVG", "resmlp:depth=64,width=128,param=mupc",
                                  "resmlp:plain,scale=1/sqrt(L)", "resnet20:width=0.5,bn=eval"])
def test_good_architectures_pass_the_check(arch):
    assert check_arch(arch) == arch


def test_zoo_models_refuse_init_scale():
    with pytest.raises(ValueError, match="--init-scale 2.0 applies to MLP architectures"):
        build_model("vgg5", "relu", 3072, 10, (3, 32, 32), init_scale=2.0)


def test_act_defaults_to_the_act_option_and_the_arch_string_overrides_it():
    def kinds(model):
        return {type(m).__name__ for m in model.modules()}

    assert "Hardtanh" in kinds(build("vgg5:width=1/16", act="hard-tanh"))
    assert "ReLU" in kinds(build("vgg5:width=1/16", act="relu"))
    assert "GELU" in kinds(build("vgg5:width=1/16,act=gelu", act="hard-tanh"))
    assert "Hardtanh" not in kinds(build("vgg5:width=1/16,act=gelu", act="hard-tanh"))


def test_vgg_pooling_option():
    assert any(isinstance(m, nn.MaxPool2d) for m in build("vgg5:width=1/16"))
    avg = build("vgg5:width=1/16,pool=avg")
    assert any(isinstance(m, nn.AvgPool2d) for m in avg) and not any(isinstance(m, nn.MaxPool2d) for m in avg)


def test_eval_batch_norm_stays_an_affine_map_in_training_mode():
    """bn=eval never uses batch statistics: a sample's output does not depend on the rest of its batch, in
    train() as in eval(), and the running statistics never move."""
    model = build("resnet20:width=0.25,bn=eval").train()
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(isinstance(m, EvalBatchNorm2d) and not m.training for m in norms)
    x = torch.randn(6, 3 * 32 * 32)
    torch.testing.assert_close(model(x)[:2], model(x[:2]))
    assert all(torch.equal(m.running_mean, torch.zeros_like(m.running_mean)) for m in norms)


def test_resnet_shortcuts_are_the_documented_maps():
    """Option A: x[:, :, ::2, ::2] zero-padded with the new channels; option B: a 1×1 strided convolution."""
    block = build("resnet20").blocks[3]          # the first block of the 32-channel stage
    x = torch.randn(2, 16, 8, 8)
    out = block.shortcut(x)
    assert out.shape == (2, 32, 4, 4)
    torch.testing.assert_close(out[:, 8:24], x[:, :, ::2, ::2])
    assert out[:, :8].abs().sum() == 0 and out[:, 24:].abs().sum() == 0
    conv1x1 = build("resnet18:width=1/16").blocks[2].shortcut[0]
    assert isinstance(conv1x1, nn.Conv2d) and conv1x1.kernel_size == (1, 1) and conv1x1.stride == (2, 2)


# -- the residual MLP and μPC -------------------------------------------------------------------------------

def test_mupc_scalings_and_weights_are_jpcs():
    """a_1 = 1/√D, a_l = 1/√(N L) with skips (L = H + 1 weight layers), a_L = 1/N, W ~ N(0, 1), no biases
    (jpc's make_mlp, make_skip_model and _get_param_scalings)."""
    D, N, H = 3072, 64, 6
    model = build(f"resmlp:depth={H},width={N},param=mupc")
    assert model.multipliers == pytest.approx([1 / math.sqrt(D)] + [1 / math.sqrt(N * (H + 1))] * (H - 1) + [1 / N])
    weights = torch.cat([p.flatten() for p in model.parameters()])
    assert weights.numel() == n_params(model) and abs(weights.std().item() - 1) < 0.01
    plain = build(f"resmlp:depth={H},width={N},param=mupc,plain")
    assert plain.multipliers[1:-1] == pytest.approx([1 / math.sqrt(N)] * (H - 1))


def test_sp_scale_option_and_weights():
    N, H = 64, 6
    sp = build(f"resmlp:depth={H},width={N}")
    assert sp.multipliers == [1.0] * (H + 1)
    assert abs(sp.blocks[0].linear.weight.std().item() * math.sqrt(N) - 1) < 0.05
    scaled = build(f"resmlp:depth={H},width={N},scale=1/sqrt(L)")
    assert scaled.multipliers[1:-1] == pytest.approx([1 / math.sqrt(H + 1)] * (H - 1))
    assert build(f"resmlp:depth={H},width={N},scale=1/4").multipliers[1] == 0.25


def test_resmlp_forward_is_the_documented_recursion():
    """h_1 = a_1 W_1 x, h_l = h_{l−1} + a_l W_l φ(h_{l−1}), y = a_L W_L φ(h_H); plain drops the h_{l−1}."""
    for plain in (False, True):
        model = ResidualMLP(10, 3, depth=4, width=8, act="tanh", param="mupc", plain=plain).double()
        x = torch.randn(5, 10, dtype=torch.float64)
        a = model.multipliers
        Ws = [b.linear.weight for b in (model.input, *model.blocks, model.readout)]
        h = a[0] * x @ Ws[0].T
        for al, W in zip(a[1:-1], Ws[1:-1]):
            h = (0 if plain else h) + al * torch.tanh(h) @ W.T
        torch.testing.assert_close(model(x), a[-1] * torch.tanh(h) @ Ws[-1].T)


def test_stream_nodes_mark_each_branch_as_one_map():
    """nodes=stream (μPC's form, mupc's default): every branch and the readout carry inferlearn_map and a
    linear unit marks each stream value h_l; nodes=units (sp's default): φ stays a unit of its own."""
    stream = build("resmlp:depth=4,width=8,param=mupc")
    assert all(getattr(b, "inferlearn_map", False) for b in (*stream.blocks, stream.readout))
    assert not getattr(stream.input, "inferlearn_map", False)
    assert all(type(n).__name__ == "Clamp" for n in stream.nodes)
    for units in (build("resmlp:depth=4,width=8"), build("resmlp:depth=4,width=8,param=mupc,nodes=units")):
        assert not any(getattr(m, "inferlearn_map", False) for m in units.modules())
        assert all(isinstance(n, nn.Identity) for n in units.nodes)
    assert all(getattr(b, "inferlearn_map", False) for b in build("resmlp:depth=4,width=8,nodes=stream").blocks)


def test_the_arch_help_lists_the_zoo():
    import argparse

    from inferlearn.commands.common import add_training_options

    p = argparse.ArgumentParser()
    add_training_options(p)
    text = " ".join(p.format_help().split())
    assert all(name in text for name in ZOO) and "NAME:KEY=VALUE" in text


@pytest.mark.parametrize("arch, rule", [("resmlp:depth=3,width=16,param=mupc", "pc"),
                                        ("resnet20:width=0.25,bn=eval", "backprop")])
def test_train_runs_a_zoo_model_end_to_end(tmp_path, arch, rule):
    """`inferlearn train --arch NAME:…` builds the model from the data's shape and trains it."""
    import json

    from inferlearn.cli import main

    out = tmp_path / "run"
    assert main(["train", "--data", "digits", "--arch", arch, "--rule", rule, "--epochs", "1", "--limit-train", "100",
                 "--out", str(out), "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert config["arch"] == arch and rec["epoch"] == 1 and math.isfinite(rec["train_loss"])
