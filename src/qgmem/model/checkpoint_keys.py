"""What a training checkpoint holds beside Lightning's own entries, named once.

The training module writes these entries and prefixes; the export reads them. Naming them here (below
both, without Lightning) keeps writer and reader on one spelling.
"""

#: what the data side used: cache key, dataset, construction and activation settings, the split
DATA_INFO = "qgmem_data_info"
#: the graph-token network's shape (:class:`~qgmem.model.graph_token.GraphTokenConfig` as a dict)
GRAPH_TOKEN = "qgmem_graph_token"
#: what an answer of the run depends on: its prompt, activation and graph mode
#: (:class:`~qgmem.activation.answer_contract.AnswerContract` as a dict)
ANSWER_CONTRACT = "qgmem_answer_contract"
#: the code that trained it (package version and git commit)
PROVENANCE = "qgmem_provenance"
#: the frozen LM as trained with: dtype, hidden size, end-of-turn id
LM = "qgmem_lm"
#: the trainable network's weights in the module's state dict
NET_PREFIX = "net."
#: the frozen LM's weights in it (only LoRA adapters are kept in a checkpoint)
LM_PREFIX = "lm."

__all__ = ["ANSWER_CONTRACT", "DATA_INFO", "GRAPH_TOKEN", "LM", "LM_PREFIX", "NET_PREFIX", "PROVENANCE"]
