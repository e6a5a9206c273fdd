"""Steps of a distributed run that some ranks run and the others wait for.

A rank that fails such a step (rank 0 building a cache, one rank building its slice) must stop every
rank: the others would otherwise wait at the next barrier until the collective's timeout (30 minutes
under NCCL), with nothing in their logs. :func:`raise_on_every_rank` replaces that barrier with a
collective that carries the failure.
"""

from __future__ import annotations

from typing import Callable


class OtherRankFailed(RuntimeError):
    """Raised on the ranks that did not fail, so that they stop with a line that says where to look."""


def raise_on_every_rank(error: BaseException | None, any_rank: Callable[[bool], bool], what: str) -> None:
    """A barrier that carries failures: every rank calls it after the step; if any rank failed, that rank
    raises its own ``error`` and every other rank raises :class:`OtherRankFailed` naming ``what``.

    ``any_rank(flag)`` is the run's "is ``flag`` true on any rank" collective (Lightning's
    ``strategy.reduce_boolean_decision(flag, all=False)``); like a barrier, every rank must call it.
    """
    if not any_rank(error is not None):
        return
    if error is not None:
        raise error
    raise OtherRankFailed(f"{what} failed on another rank (that rank's log says why); this rank stops too")
