"""Exceptions and warnings raised by inferlearn.

Every error names what was wrong and how to fix it; tests run with our warnings turned into errors.
"""


class InferlearnError(Exception):
    """Base class of inferlearn's own errors: the message, and keyword arguments as attributes
    (``WriteError(message, path=p).path == p``)."""

    def __init__(self, message: str = "", **attributes):
        super().__init__(message)
        self.__dict__.update(attributes)


class DataError(InferlearnError):
    """A dataset could not be found, downloaded or verified (missing, truncated or corrupt file)."""


class RunFolderError(InferlearnError):
    """A run folder cannot be used: it holds another run, lacks its config or checkpoint, is damaged or
    cannot be written."""


class WriteError(RunFolderError):
    """A file could not be written (disk full, quota exceeded, I/O error, read-only file system): the message names
    the file, the space it needs and the fix. The file's previous version, if any, is left intact (atomic writes).

    Attributes:
        path: the file that could not be written.
    """

    path: str


class DivergenceError(InferlearnError):
    """Training produced a non-finite loss or non-finite weights."""


class ConvergenceError(InferlearnError):
    """An iterative solver did not reach the requested accuracy."""


class NonFiniteError(ConvergenceError):
    """An iterative solver met non-finite weights or produced non-finite activations (in training: the run
    diverged, and the training loop reports it as a :class:`DivergenceError` naming the epoch and step)."""


class DistributedError(InferlearnError):
    """A data- or block-parallel run lost a process: another rank died, hung past the timeout, or the
    process group could not be formed."""


class Interrupted(InferlearnError):
    """A run was stopped by a signal (SIGINT, SIGTERM, ...): the message says how to continue it.

    Attributes:
        signum: the signal's number (the command exits with ``128 + signum``, as a shell does).
    """

    signum: int


class InferlearnWarning(UserWarning):
    """Base class of inferlearn's warnings (e.g. a solver stopped before its tolerance)."""


class ConvergenceWarning(InferlearnWarning):
    """An iterative solver stopped at its iteration limit before reaching its tolerance."""


class PrecisionWarning(InferlearnWarning):
    """A computation's signal is so small against its operands that the floating-point type cannot
    resolve it (e.g. a contrastive difference of order γ^{L-1} in float32)."""


class UnverifiedDataWarning(InferlearnWarning):
    """A data file whose checksum does not match the published one was read, by explicit opt-in
    (``allow_unverified=True``, ``--allow-unverified``)."""
