"""Property-based tests (Hypothesis): over rule options and command-line options, the outcome is either
a clear error (ValueError / one `inferlearn: error:` line naming the value) or a correct run (finite
gradients, exit code 0) -- never a traceback, a NaN gradient or a silent acceptance of nonsense.

The default run draws the same examples every time (``derandomize``), so a test run passes or fails on the code,
not on the draw; ``INFERLEARN_EXPLORE=1`` draws fresh examples (``max_examples`` × 5) to look for new edge cases."""
import contextlib
import dataclasses
import io
import math
import os
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlearn.cli import main
from inferlearn.errors import ConvergenceError, InferlearnWarning
from inferlearn.models import MLP
from inferlearn.rules import RULES, make_rule

EXPLORE = os.environ.get("INFERLEARN_EXPLORE", "") not in ("", "0")
SETTINGS = settings(max_examples=300 if EXPLORE else 60, deadline=None, derandomize=not EXPLORE, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-5, 50).map(str),
    st.sampled_from(["", "none", "1/8", "1/0", "abc", "true", "false", "-0", "1e-300", "1e300", "symmetric",
                     "block-pg", "cd", "reference", "auto", "generic", "fused", "quadratic", "global"]),
    st.text(max_size=8),
)


@st.composite
def rule_and_options(draw):
    name = draw(st.sampled_from(sorted(RULES)))
    fields = [f.name for f in dataclasses.fields(RULES[name])] + ["bogus"]
    keys = draw(st.lists(st.sampled_from(fields), max_size=3, unique=True))
    return name, {k: draw(values) for k in keys}


@SETTINGS
@given(rule_and_options())
def test_rule_options_give_a_clear_error_or_finite_gradients(case):
    name, options = case
    try:
        rule = make_rule(name, options)
    except ValueError as exc:
        assert str(exc) and ("Invalid" in str(exc) or "Unknown" in str(exc)), exc
        return
    model = MLP("6-5-3", "relu", seed=0)
    x, labels = torch.rand(4, 6), torch.tensor([0, 1, 2, 0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InferlearnWarning)
            info = rule.backward(model, x, labels)
    except (ValueError, ConvergenceError) as exc:   # e.g. solver 'cd' with a tolerance it cannot meet
        assert str(exc)
        return
    assert math.isfinite(info.loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


cli_values = {
    "--lr": st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["abc", "", "1/2"])),
    "--epochs": st.one_of(st.integers(-2, 1).map(str), st.sampled_from(["x", "1.5", ""])),
    "--batch-size": st.one_of(st.integers(-2, 80).map(str), st.sampled_from(["big", ""])),
    "--arch": st.one_of(st.sampled_from(["64-8-10", "64-10", "conv:2/4", "conv:2-2", "64-8", "8-8-10", "conv:",
                                         "x:y", "64--10", "64-8-10-", "conv:0"]), st.text(max_size=6)),
    "--act": st.sampled_from(["relu", "hard-sigmoid", "hardtanh", "linear", "swish", "", "RELU"]),
    "--momentum": st.floats(-1, 2).map(repr),
    "--init-scale": st.one_of(st.floats(allow_nan=True).map(repr), st.just("0")),
    "--lr-schedule": st.sampled_from(["constant", "warmup", "scaled:0.5", "scaled:-1", "cosine", "scaled:",
                                           "warmup:1:0.5:1", "warmup:1:0:1", "warmup:"]),
    "--rule": st.sampled_from(sorted(RULES) + ["nope", ""]),
    "--limit-train": st.one_of(st.integers(-1, 120).map(str), st.just("many")),
}


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(cli_values)), st.none(), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: cli_values[k] for k in keys})))
def test_train_options_give_one_clear_line_or_a_run(tmp_path_factory, options):
    out = tmp_path_factory.mktemp("prop")
    base = {"--data": "digits", "--arch": "64-8-10", "--epochs": "1", "--limit-train": "60", "--batch-size": "30"}
    args = ["train", "--quiet", "--out", str(out / "run")]
    for k, v in (base | options).items():
        args += [k, v]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InferlearnWarning)
                rc = main(args)
    except SystemExit as exc:   # argparse: wrong type
        rc = exc.code
    text = err.getvalue()
    assert "Traceback" not in text
    if rc == 0:
        assert (out / "run" / "metrics.jsonl").exists()
    else:
        assert rc == 2 and text.strip(), (args, text)
