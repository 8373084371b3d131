"""The field's benchmark: named protocols (data set × model × rule variants, search spaces, budgets) and the
runner that searches hyper-parameters on a validation split and reports final runs over seeds
(``inferlearn benchmark``). It lives above the training loop: it builds ``TrainConfig`` s and reads run folders."""
from .catalogue import PROTOCOLS, load_protocol
from .protocols import Budget, Protocol, Reference, Variant, parse_budget
from .runner import Settings, format_plan, run_benchmark

__all__ = ["PROTOCOLS", "Budget", "Protocol", "Reference", "Variant", "Settings", "format_plan", "load_protocol",
           "parse_budget", "run_benchmark"]
