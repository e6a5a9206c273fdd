"""``python resume_child.py ARGS``: the tiny ``train.py`` run of test_train_cli, for a child process to SIGKILL.

``--trainer.callbacks+=__main__.KillAt --trainer.callbacks.init_args.step N`` kills the process with
SIGKILL when it is about to run the step after global step ``N`` (no cleanup, no final checkpoint).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_cli import TinyData  # noqa: E402

from qgmem.job import main  # noqa: E402


class KillAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:], datamodule_class=TinyData)
