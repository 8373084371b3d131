"""Learning rules. Importing this package registers every rule in :data:`RULES`.

Each rule fills ``.grad`` and never steps (see :mod:`inferlearn.rules.base`).
"""
from .base import RULES, Rule, StepInfo, accumulate_grad, make_rule, register_rule, rule_options
from .backprop import BackProp
from .linear_regression import LinearRegression, least_squares_fit
from .contrastive import Contrastive
from .lifted import LiftedJ0
from .fenchel import FenchelBackProp
from .eqprop import EquilibriumPropagation
from .clamped_inference import LiftedFenchel, PredictiveCoding

__all__ = ["RULES", "Rule", "StepInfo", "accumulate_grad", "make_rule", "register_rule", "rule_options",
           "BackProp", "LinearRegression", "least_squares_fit", "Contrastive", "LiftedJ0"]
