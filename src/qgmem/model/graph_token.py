"""The trainable part of QGMem: graph encoder + readout + projector → ``K`` graph tokens per local graph.

This module needs only torch and PyG, so serving can load an export without Lightning or the training
code; its config round-trips through ``config.json`` (an export written before ``features``/``readout``
existed loads as the paper's ``text`` features and ``mean`` readout: :mod:`qgmem.older_records`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
from qgmem.model.alignment import MAX_WORD_PIECES, PAD_PIECE, word_targets
from qgmem.model.features import compose, edge_width, needs_fact, needs_words, node_width
from qgmem.model.kv_prefix import Injection, KVPrefix, KVProjector, check_injection
from qgmem.model.projector import GraphProjector
from qgmem.model.readout import GraphReadout, check_readout
from qgmem.older_records import read_graph_token


@dataclass
class GraphTokenConfig:
    """Everything needed to rebuild the network: input widths, features, encoder shape, readout, LM hidden size.

    ``features``: which memory content the encoder reads (see :mod:`qgmem.model.features`).
    ``readout``: ``mean`` (one token), ``queries``, ``nodes``, ``summary_nodes`` or ``summary_units``
    (``num_graph_tokens`` tokens, see :mod:`qgmem.model.readout`; ``summary_units`` over a graph of
    ``k_graph`` units takes ``num_graph_tokens = 1 + k_graph``).
    ``injection``: where the ``K`` readout vectors enter the LM: ``input`` (``K`` vectors among its input
    embeddings) or ``kv_prefix`` (a key and a value per vector at each of the LM's ``lm_layers`` layers,
    ``lm_kv_width`` wide; :mod:`qgmem.model.kv_prefix`). The one field with a default: a config that
    names no injection (every one written before the setting, and a network built in code) is ``input``;
    the product's choice is ``QGMemModule``'s signature.
    """

    feature_dim: int
    edge_dim: int
    lm_hidden: int
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    projector_hidden: int | None = None
    features: str = field(kw_only=True)
    readout: str = field(kw_only=True)
    num_graph_tokens: int = field(kw_only=True)
    injection: Injection = field(default="input", kw_only=True)
    lm_layers: int | None = field(default=None, kw_only=True)
    lm_kv_width: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        edge_width(self.features, self.edge_dim)  # validates the option
        check_readout(self.readout, self.num_graph_tokens)
        check_injection(self.injection)
        if self.injection == "kv_prefix" and not (self.lm_layers and self.lm_kv_width):
            raise ValueError("injection 'kv_prefix' needs the LM's layer count and key/value width "
                             f"(lm_layers, lm_kv_width), got {self.lm_layers} and {self.lm_kv_width}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GraphTokenConfig:
        d = read_graph_token(d)  # older names and the fields older configs lack (qgmem.older_records)
        d["encoder"] = EncoderConfig(**d.get("encoder", {}))
        return cls(**d)


class GraphTokenNet(nn.Module):
    """Encode a (batched) local memory graph into ``[num_graphs, K, lm_hidden]`` graph tokens."""

    def __init__(self, config: GraphTokenConfig):
        super().__init__()
        self.config = config
        self.encoder = RelationalGraphEncoder(node_width(config.features, config.feature_dim, config.lm_hidden),
                                              edge_width(config.features, config.edge_dim), config.encoder)
        object.__setattr__(self, "_word_source", None)  # the LM's input embeddings, for ``node_words`` (not saved)
        self.readout = GraphReadout(config.readout, config.encoder.hidden, config.num_graph_tokens, config.encoder.heads)
        if config.injection == "kv_prefix":
            self.projector = KVProjector(config.encoder.hidden, config.lm_hidden, config.lm_layers, config.lm_kv_width,
                                         config.projector_hidden)
        else:
            self.projector = GraphProjector(config.encoder.hidden, config.lm_hidden, config.projector_hidden)

    def use_word_embedding(self, embedding: nn.Module | torch.Tensor) -> None:
        """The frozen LM's input embeddings (module or ``[V, H]`` weight), read by the ``node_words``
        features. Kept outside the state dict: it belongs to the LM, not to this network."""
        table = embedding.weight if isinstance(embedding, nn.Module) else embedding
        if table.dim() != 2 or table.size(1) != self.config.lm_hidden:
            raise ValueError(f"word embeddings must be [vocab, {self.config.lm_hidden}], got {tuple(table.shape)}")
        # set past nn.Module's registration: the LM's weight must not become a parameter of this network
        object.__setattr__(self, "_word_source", embedding)

    def node_words(self, graph) -> torch.Tensor | None:
        """``[N, lm_hidden]`` word vectors of the graph's nodes (``None`` unless the features read them)."""
        if not needs_words(self.config.features):
            return None
        source = self._word_source
        if source is None:
            raise RuntimeError("graph features 'node_words' need the LM's input embeddings: call "
                               "use_word_embedding(lm.get_input_embeddings()) first")
        table = source.weight if isinstance(source, nn.Module) else source
        ids = getattr(graph, "node_word_ids", None)
        if ids is None:  # e.g. the all-zero node of an empty working memory: no words, a zero vector
            ids = torch.full((graph.x.size(0), MAX_WORD_PIECES), PAD_PIECE, dtype=torch.long, device=graph.x.device)
        return word_targets(ids.to(table.device), table.detach())[0].to(graph.x.device)

    def forward(self, graph) -> torch.Tensor | KVPrefix:
        """``graph``: a PyG ``Data`` or ``Batch`` with ``x``, ``edge_index``, ``edge_attr`` (and ``edge_fact``
        when the features need it, ``edge_unit`` with the ``summary_units`` readout). Returns the graph tokens
        ``[num_graphs, K, lm_hidden]``, or with ``injection: kv_prefix`` their :class:`KVPrefix`."""
        h, batch, num_graphs = self.node_states(graph)
        out = self.projector(self.readout(h, batch, num_graphs, graph.edge_index, getattr(graph, "edge_unit", None)))
        return KVPrefix(out) if self.config.injection == "kv_prefix" else out

    def node_tokens(self, graph) -> torch.Tensor:
        """Every node's state through the projector, ``[N, lm_hidden]``: what a ``nodes`` readout inserts
        for that node, and what :mod:`qgmem.model.alignment` fits to the LM's word embeddings."""
        if self.config.injection != "input":
            raise ValueError(f"node tokens are input embeddings; injection {self.config.injection!r} writes "
                             "keys and values instead (the word alignment does not apply to it)")
        return self.projector(self.node_states(graph)[0])

    def node_states(self, graph) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Relation-aware node states ``[N, hidden]``, with the node → graph index and the graph count."""
        batch = getattr(graph, "batch", None)
        num_graphs = int(graph.num_graphs) if batch is not None else 1
        if batch is None:
            batch = torch.zeros(graph.x.size(0), dtype=torch.long, device=graph.x.device)
        edge_attr = graph.edge_attr
        if edge_attr is None:  # a graph without edges may come without an edge_attr tensor
            edge_attr = graph.x.new_zeros((0, self.config.edge_dim))
        edge_fact = getattr(graph, "edge_fact", None) if needs_fact(self.config.features) else None
        if edge_fact is None and edge_attr.size(0) == 0 and needs_fact(self.config.features):
            edge_fact = edge_attr
        x, edge_attr = compose(self.config.features, graph.x, graph.edge_index, edge_attr, edge_fact,
                               self.node_words(graph))
        return self.encoder.node_states(x, graph.edge_index, edge_attr), batch, num_graphs
