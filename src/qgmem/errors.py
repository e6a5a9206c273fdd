"""The one error type for a user's mistake (bad path, bad file, bad flag value, bad record).

The ``qgmem`` command line prints a :class:`UserError` as one message and exits 2 without a traceback
(``--debug`` shows it); anything else is a bug and keeps its traceback. Every stage raises a subclass
(or plain ``UserError``) where the cause is the input, never the code, and names the file, record or
field so the message alone is enough to fix it. ``hint`` is the command or action that fixes it.

This module imports nothing from qgmem, so every layer (data, memory, activation, training, export,
serving) can raise these errors without importing anything above itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: exit code of a user error (argparse uses 2 for a bad flag, the convention this follows)
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A problem with the input, reported as one line (plus an optional ``hint``) and exit code 2."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message} ({self.hint})" if self.hint else message


class InputPathError(UserError, FileNotFoundError):
    """A path the user gave that is missing, or of the wrong kind (a folder where a file is expected)."""


class IntegrityError(UserError, ValueError):
    """A file on disk whose size or checksum differs from what was written: corrupt or truncated."""


@contextmanager
def as_user_error(*types: type[BaseException], prefix: str = "") -> Iterator[None]:
    """Re-raise ``types`` (``ValueError`` from a settings dataclass, say) as a :class:`UserError`.

    For the spots where a command hands a flag value to code that validates it: the code keeps raising
    its natural exception, and the command says it was the user's input.
    """
    try:
        yield
    except UserError:
        raise
    except types as exc:
        raise UserError(f"{prefix}{exc}") from exc
