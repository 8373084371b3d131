"""Data-parallel training on ``torch.distributed``: process groups, gradient averaging, the launcher.

See :mod:`inferlearn.distributed.group` (the maths of sharded batch-mean gradients) and
:mod:`inferlearn.distributed.launch` (``--nproc N``).
"""
from .group import DEFAULT_TIMEOUT_S, Group, join, world_from_env
from .launch import check_nproc, launch, strip_nproc

__all__ = ["DEFAULT_TIMEOUT_S", "Group", "join", "world_from_env", "check_nproc", "launch", "strip_nproc"]
