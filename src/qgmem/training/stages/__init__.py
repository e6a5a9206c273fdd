"""Training stages: the parts of a recipe beside the answer loss (:class:`Stage`), listed in ``model.stages``.

- :class:`NodeWordAlignment` (the default's): node tokens fitted to the LM's word embeddings, as
  pre-training steps and as a term each step;
- :class:`MemoryReconstruction` (the compact preset's stage 1): pre-training in which the frozen LM
  regenerates the memory entries the prompt's text leaves out from the graph tokens;
- :class:`Distillation` (the compact preset's stage 2): KL(full-text teacher ‖ student) as a term each step.
"""

from qgmem.training.stages.base import AnswerLogits, Stage, as_stage, check_stages, stage_record
from qgmem.training.stages.distillation import Distillation
from qgmem.training.stages.reconstruction import MemoryReconstruction
from qgmem.training.stages.words import NodeWordAlignment

__all__ = ["AnswerLogits", "Distillation", "MemoryReconstruction", "NodeWordAlignment", "Stage", "as_stage",
           "check_stages", "stage_record"]
