"""Train the QGMem graph token: ``python train.py`` runs the embedded default (configs/default.yaml).

Cache → fit → checkpoint selection on validation → test of the best checkpoint → export. Any value can
be overridden, e.g. ``python train.py --trainer.max_epochs 3 --model.encoder.layers 3``; the paper's
setting is ``python train.py --config configs/qwen3_8b.yaml``; ``--ckpt_path last`` resumes.
"""

from pathlib import Path

from qgmem.training.cli import main

if __name__ == "__main__":
    main(default_config=Path(__file__).resolve().parent / "configs" / "default.yaml")
