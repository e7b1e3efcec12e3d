"""Exceptions for a user's mistakes.

Each one says where (file, line, argument), what was found and what was expected. The CLI prints ``str(err)``
as one line on stderr and exits non-zero; library callers can catch the specific class or ``HaloflowError``.
The input errors also subclass ``ValueError`` so that ordinary ``except ValueError`` code keeps working.
"""

from __future__ import annotations

__all__ = [
    "HaloflowError",
    "InputFormatError",
    "ConfigError",
    "OutputExistsError",
    "PartitionFormatError",
    "PlanError",
    "DistributedError",
    "CheckpointError",
    "OutputError",
    "RunFailed",
]


class HaloflowError(Exception):
    """Base class of every error haloflow raises for bad input or configuration."""


class InputFormatError(HaloflowError, ValueError):
    """A data file is malformed. Carries the path and, where known, the 1-based line number."""

    def __init__(self, path, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ConfigError(HaloflowError, ValueError):
    """An argument or config field is out of range; the message names it and the allowed values.

    ``field`` is the config field it is about (when there is one), so that the CLI can name the flag a user typed.
    """

    def __init__(self, message: str, *, field: str | None = None):
        self.field = field
        super().__init__(message)


class OutputError(HaloflowError, OSError):
    """An output could not be written: its file system is full, or the path names something haloflow may not
    replace. The message names the path; ``errno`` is the OS's (``ENOSPC``) where there is one."""

    def __init__(self, path, message: str, *, errno: int | None = None):
        self.path = str(path)
        self.reason = message
        super().__init__(f"cannot write {self.path}: {message}")
        self.errno = errno


class OutputExistsError(ConfigError, FileExistsError):
    """An output folder or file is already there and ``overwrite`` was not given."""


class PartitionFormatError(HaloflowError, ValueError):
    """A partition folder is missing, truncated, corrupt or of another format version."""


class PlanError(HaloflowError, ValueError):
    """A sharding plan cannot be made or followed (for example the memory budget is too small)."""


class DistributedError(HaloflowError, RuntimeError):
    """A peer process died, timed out or disagrees about the layout."""


class CheckpointError(HaloflowError, ValueError):
    """A checkpoint is missing, damaged, or of another model, data set or optimizer than the run resuming it."""


class RunFailed(HaloflowError, RuntimeError):
    """The run itself failed, not the input: a loss that is no longer a finite number. The message says where it
    stopped (the unit, the loss, the last good checkpoint); the CLI prints it as one line and exits 1, as for any
    run that did not finish."""
