"""Errors and skip accounting for loaders: bad input names its file, item and field."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from qgmem.errors import UserError


class DataFormatError(UserError, ValueError):
    """A record that does not have the documented shape.

    The message always says where: ``file``, ``item`` (index in the file) and ``field``. It is a
    :class:`~qgmem.errors.UserError`, so the command line prints it as one line and exits 2.
    """

    def __init__(self, message: str, *, file: str | None = None, item: int | str | None = None,
                 field: str | None = None):
        self.file, self.item, self.field = file, item, field
        where = ", ".join(
            f"{name} {value}" for name, value in (("file", file), ("item", item), ("field", field))
            if value is not None
        )
        super().__init__(f"{where}: {message}" if where else message)


@dataclass
class SkipReport:
    """Counts what lenient loading skipped, with the reason for each skip (never silent)."""

    skipped: list[str] = field(default_factory=list)

    def add(self, error: Exception) -> None:
        self.skipped.append(str(error))

    def __len__(self) -> int:
        return len(self.skipped)

    def summary(self) -> dict[str, object]:
        kinds = Counter(s.split(": ", 1)[-1][:80] for s in self.skipped)
        return {"skipped": len(self.skipped), "reasons": dict(kinds.most_common(10))}
