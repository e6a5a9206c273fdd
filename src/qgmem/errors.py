"""The one error type for a user's mistake (bad path, bad file, bad flag value, bad record).

Every command line (``qgmem COMMAND``, ``train.py``, ``python -m`` entry points) prints a
:class:`UserError` as one message and exits 2 without a traceback (``--debug`` shows it); anything else
is a bug and keeps its traceback. That convention lives here too (:func:`run_command`). Every stage raises a subclass
(or plain ``UserError``) where the cause is the input, never the code, and names the file, record or
field so the message alone is enough to fix it. ``hint`` is the command or action that fixes it.

This module imports nothing from qgmem, so every layer (data, memory, activation, training, export,
serving) can raise these errors without importing anything above itself.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

#: exit code of a user error (argparse uses 2 for a bad flag, the convention this follows)
USER_ERROR_EXIT = 2
#: anywhere on a command line: print the traceback of a user error as well
DEBUG_FLAG = "--debug"


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


class SettingError(UserError, ValueError):
    """A setting outside its allowed range; the message names the setting."""


class IntegrityError(UserError, ValueError):
    """A file on disk whose size or checksum differs from what was written: corrupt or truncated."""


class ExportFormatError(UserError, ValueError):
    """An export whose files or config fields cannot be served by this code; the message names the field."""


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


# ---- the command-line convention ------------------------------------------------------------------

#: OS errors that, reaching the command line, mean the user named a wrong path (their message names it)
PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without :data:`DEBUG_FLAG`, and whether it was there."""
    argv = list(argv)
    return [a for a in argv if a != DEBUG_FLAG], DEBUG_FLAG in argv


def print_error(prog: str, exc: BaseException, debug: bool) -> int:
    """``PROG: error: MESSAGE`` on stderr (the traceback first with ``debug``); returns the exit code 2."""
    if debug:
        traceback.print_exception(exc)
    message = str(exc) or type(exc).__name__
    print(f"{prog}: error: {message}", file=sys.stderr)
    if not debug:
        print(f"{prog}: (run again with {DEBUG_FLAG} for the traceback)", file=sys.stderr)
    return USER_ERROR_EXIT


def run_command(prog: str, command: Callable[[list[str]], int | None], argv: Sequence[str],
                debug: bool = False) -> int:
    """Run ``command(argv)`` under the user-error convention; any other exception keeps its traceback."""
    try:
        return int(command(list(argv)) or 0)
    except (UserError, *PATH_ERRORS) as exc:
        return print_error(prog, exc, debug)


def command_parser(prog: str, description: str,
                   add_arguments: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """The parser of a command: its ``add_arguments`` plus ``--debug`` and ``--config``.

    A jsonargparse parser, as the training commands have, so every flag is also a key of a ``--config``
    YAML file and ``--print_config`` shows the resolved values.
    """
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    parser.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of this command's flags")
    return parser


def argparse_command(prog: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                     run: Callable[[argparse.Namespace], int | None]) -> Callable[[list[str]], int]:
    """A ``command(argv)`` for :func:`run_command`: parse with :func:`command_parser`, then ``run``.

    ``--help`` returns 0 and a bad flag 2 (argparse prints the usage and the reason) instead of exiting.
    """
    def command(argv: list[str]) -> int:
        parser = command_parser(prog, description, add_arguments)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
        return int(run(args) or 0)

    return command
