"""OpenMP threads that sleep instead of spinning while they wait: the entry points' CPU setting.

On a CPU shared with another busy process, OpenMP's default of spinning threads makes torch's
two-thread kernels wait on a core the other process holds: a forward and backward pass of SmolLM2
(4 × 288 tokens) took 25–29 s by default and 13–16 s with ``OMP_WAIT_POLICY=PASSIVE`` on a 2-core
machine at load 4 (``docs/BENCHMARKS.md``). The setting must be in the environment before torch is
first imported, so ``train.py`` and the ``qgmem`` command call :func:`prefer_passive_waiting` first;
a value the user set is kept.
"""

from __future__ import annotations

import os


def prefer_passive_waiting() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already chose a policy."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
