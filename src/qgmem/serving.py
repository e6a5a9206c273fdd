"""Serving an exported graph-token encoder: load it, check it fits the LM, answer with it.

Needs torch, PyG, safetensors and transformers only: neither Lightning nor the training loop. The
prompt is built with the shared :class:`~qgmem.prompting.PromptEncoder` under the export's prompt
settings, so the graph token lands exactly where it was during training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch_geometric.data import Batch, Data

from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet

WEIGHTS_FILE = "graph_encoder.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "qgmem-graph-token"


class HiddenSizeMismatch(ValueError):
    """The export's graph tokens do not live in the target LM's embedding space."""


class GraphTokenEncoder(GraphTokenNet):
    """The exported encoder + projector; ``export_config`` is the export's ``config.json``."""

    export_config: dict[str, Any]

    @classmethod
    def from_pretrained(cls, path: str | Path, expected_hidden_size: int | None = None,
                        device: str | torch.device = "cpu") -> GraphTokenEncoder:
        """Load ``path/graph_encoder.safetensors`` + ``path/config.json`` (eval mode, no gradients).

        ``expected_hidden_size``: the serving LM's hidden size; a different size is refused, since a
        token trained for one embedding space is meaningless in another.
        """
        path = Path(path)
        config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
        for required in (config_path, weights_path):
            if not required.is_file():
                raise FileNotFoundError(f"{required} is missing: {path} is not a QGMem export folder")
        config = json.loads(config_path.read_text())
        if config.get("format") != FORMAT:
            raise ValueError(f"{config_path}: field 'format' is {config.get('format')!r}, expected {FORMAT!r}")
        net_config = GraphTokenConfig.from_dict(config["graph_token"])
        if expected_hidden_size is not None and int(expected_hidden_size) != net_config.lm_hidden:
            raise HiddenSizeMismatch(
                f"{path}: the graph encoder was trained for LM {config['lm'].get('id')!r} with hidden size "
                f"{net_config.lm_hidden}, but the serving LM has hidden size {expected_hidden_size}; "
                "export an encoder trained against this LM instead")
        model = cls(net_config)
        model.load_state_dict(load_file(str(weights_path)), strict=True)
        model.export_config = config
        model.requires_grad_(False)
        return model.to(device).eval()

    @torch.no_grad()
    def encode(self, graphs: Data | list[Data]) -> torch.Tensor:
        """``[num_graphs, K, lm_hidden]`` graph tokens (``K`` from the readout); empty graphs become one all-zero node."""
        graphs = [graphs] if isinstance(graphs, Data) else list(graphs)
        device = next(self.parameters()).device
        fixed = [_non_empty(g, self.config.feature_dim) for g in graphs]
        return self(Batch.from_data_list(fixed).to(device))


def _non_empty(graph: Data, dim: int) -> Data:
    """The tensors the encoder reads (``edge_fact`` too when present), with an empty graph as one zero node."""
    if graph.x is not None and graph.x.size(0) > 0:
        edge_attr = graph.edge_attr if graph.edge_attr is not None else graph.x.new_zeros((0, dim))
        extra = {"edge_fact": graph.edge_fact.float()} if getattr(graph, "edge_fact", None) is not None else {}
        return Data(x=graph.x.float(), edge_index=graph.edge_index.long(), edge_attr=edge_attr.float(), **extra)
    return Data(x=torch.zeros(1, dim), edge_index=torch.zeros(2, 0, dtype=torch.long), edge_attr=torch.zeros(0, dim),
                edge_fact=torch.zeros(0, dim))


class GraphTokenAnswerer:
    """Answer a question from a working memory with a frozen LM plus the exported graph token.

    ``lm``/``tokenizer`` default to the export's LM id (local folder, hub id or embedded alias).
    """

    def __init__(self, encoder: GraphTokenEncoder, lm: Any = None, tokenizer: Any = None,
                 max_prompt_tokens: int | None = None, max_new_tokens: int = 64, lm_dtype: str = "auto"):
        from qgmem.lm import load_causal_lm, load_tokenizer
        from qgmem.prompting import PromptEncoder, PromptSettings

        cfg = encoder.export_config
        lm_id = cfg["lm"]["id"]
        self.lm = lm if lm is not None else load_causal_lm(lm_id, dtype=lm_dtype)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(lm_id)
        hidden = self.lm.get_input_embeddings().embedding_dim
        if hidden != encoder.config.lm_hidden:
            raise HiddenSizeMismatch(f"graph tokens are {encoder.config.lm_hidden}-d but the LM's embeddings are "
                                     f"{hidden}-d (export trained for {lm_id!r})")
        self.encoder = encoder.to(self.lm.device)
        settings = PromptSettings.from_dict(cfg.get("prompt"))
        if max_prompt_tokens:
            settings.max_prompt_tokens = max_prompt_tokens
        self.prompts = PromptEncoder(self.tokenizer, settings)
        self.max_new_tokens = max_new_tokens
        self.use_graph = cfg.get("graph_mode", "token") != "none"

    @torch.no_grad()
    def answer(self, graph: Data, memory_text: str, question: str) -> str:
        from qgmem.model.fusion import insert_token
        from qgmem.prompting import final_answer, generate

        encoded = self.prompts.prompt(memory_text, question)
        device = self.lm.device
        ids = torch.tensor([encoded.ids], device=device)
        embeds = self.lm.get_input_embeddings()(ids)
        token = self.encoder.encode(graph) if self.use_graph else None
        embeds, mask, positions, _ = insert_token(embeds, torch.ones_like(ids), torch.tensor([encoded.graph_pos]),
                                                  token)
        settings = self.prompts.settings
        out = generate(self.lm, self.tokenizer, mask, inputs_embeds=embeds, max_new_tokens=self.max_new_tokens,
                       stop_ids=self.prompts.stop_ids, pad_id=self.prompts.pad_id,
                       stop_at_newline=settings.first_line and not settings.enable_thinking)
        return final_answer(out.texts[0], settings.first_line)

    def answer_working_memory(self, working_memory: Any, sentence_encoder: Any, reverse_edges: bool | None = None) -> str:
        """Answer from a :class:`qgmem.activation.records.WorkingMemory` (graph features built here)."""
        from qgmem.activation.graph import graph_to_data
        from qgmem.model.features import needs_fact

        dim = int(getattr(sentence_encoder, "dim", self.encoder.config.feature_dim))
        if dim != self.encoder.config.feature_dim:
            expected = (self.encoder.export_config.get("sentence_encoder") or {}).get("id")
            raise ValueError(f"the sentence encoder gives {dim}-d features but the graph encoder was trained on "
                             f"{self.encoder.config.feature_dim}-d features from {expected!r}")
        if reverse_edges is None:
            reverse_edges = bool((self.encoder.export_config.get("activation") or {}).get("reverse_edges", False))
        facts = [u.fact for u in working_memory.units] if needs_fact(self.encoder.config.features) else None
        graph = graph_to_data(working_memory.graph, sentence_encoder, reverse_edges=reverse_edges, facts=facts)
        return self.answer(graph, working_memory.text, working_memory.question)
