"""Learning rules. Importing this package registers every rule in :data:`RULES`.

Each rule fills ``.grad`` and never steps (see :mod:`inferlearn.rules.base`); each file is one rule,
a thin configuration of the engine (:mod:`inferlearn.engine`).
"""
from .base import (RULES, PerSampleRule, Rule, StepInfo, accumulate_grad, make_rule, recommended_lr, register_rule,
                   rule_options)
from .backprop import BackProp
from .contrastive import Contrastive
from .lifted import LiftedJ0
from .fenchel import FenchelBackProp
from .eqprop import EquilibriumPropagation
from .predictive_coding import PredictiveCoding
from .error_predictive_coding import ErrorPredictiveCoding
from .lifted_fenchel import LiftedFenchel
from .mac import MAC
from .lpom import LPOM

__all__ = ["PerSampleRule", "RULES", "Rule", "StepInfo", "accumulate_grad", "make_rule", "recommended_lr", "register_rule", "rule_options",
           "BackProp", "Contrastive", "LiftedJ0", "FenchelBackProp", "EquilibriumPropagation",
           "PredictiveCoding", "ErrorPredictiveCoding", "LiftedFenchel", "MAC", "LPOM"]
