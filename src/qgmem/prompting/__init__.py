"""The prompt contract shared by the answer filter, training, ``qgmem eval-qa`` and serving.

- :mod:`~qgmem.prompting.contract`: the wording (system prompt, user turn) and :class:`PromptSettings`,
  which is set once per run and travels in checkpoints and exports;
- :mod:`~qgmem.prompting.encoder`: :class:`PromptEncoder`, the tokenized prompt with the graph-token slot;
- :mod:`~qgmem.prompting.generate`: the one generation helper;
- :mod:`~qgmem.prompting.answer`: the rule that reads an answer back (the answer cut);
- :mod:`~qgmem.prompting.entries`: the written form of a working-memory entry.
"""

from qgmem.prompting.contract import (GRAPH_ONLY_SYSTEM_PROMPT, NO_MEMORY_TEXT, SYSTEM_PROMPT, PromptSettings, build_messages,
                                      memory_with_graph_text, user_content)
from qgmem.prompting.encoder import EncodedPrompt, PromptEncoder, end_of_turn_id, stop_token_ids
from qgmem.prompting.answer import final_answer, reply_shape
from qgmem.prompting.generate import Generation, generate, left_pad

__all__ = ["GRAPH_ONLY_SYSTEM_PROMPT", "NO_MEMORY_TEXT", "SYSTEM_PROMPT", "EncodedPrompt", "Generation", "PromptEncoder", "PromptSettings",
           "build_messages", "end_of_turn_id", "memory_with_graph_text", "final_answer", "generate", "left_pad", "reply_shape", "stop_token_ids",
           "user_content"]
