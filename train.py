"""Train the QGMem graph token: ``python train.py`` runs the embedded default (preset ``default``).

Cache → fit → checkpoint selection on validation → test of the best checkpoint → export. Any value can
be overridden, e.g. ``python train.py --trainer.max_epochs 3 --model.encoder.layers 3``; the paper's
setting is ``python train.py --config qwen3_8b`` (a preset name or a YAML path); ``--ckpt_path last``
resumes. One stage at a time: ``qgmem fit|validate|test --config ...``.
"""

import sys

from qgmem.omp import prefer_passive_waiting

prefer_passive_waiting()  # before torch is imported

from qgmem.job import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main(default_config="default"))
