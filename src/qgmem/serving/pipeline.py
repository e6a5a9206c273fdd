"""``QGMemPipeline``: from an export (folder or hub id) and a dialogue history to answers.

Everything is rebuilt from the export alone: the sentence encoder, the construction and activation
settings, the graph encoder + projector and the frozen LM (with its LoRA adapters when the run had
them). A question then goes through the same steps as in training: activation over the memory store,
the local graph's features, the prompt contract (:mod:`qgmem.prompting`), the graph token(s) inserted
at their slot, and the shared greedy generation helper. ``graph`` picks the ablation on the same
weights: ``token`` (QGMem), ``none`` (text only) or ``shuffled`` (each question gets another
question's graph).

Serving imports neither Lightning nor :mod:`qgmem.training`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch_geometric.data import Data

from qgmem.activation.config import ActivationConfig
from qgmem.model.graph_modes import empty_graph
from qgmem.activation.records import WorkingMemory
from qgmem.errors import UserError
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.store import MemoryStore
from qgmem.model.features import needs_words
from qgmem.model.graph_modes import check_mode, shuffled
from qgmem.model.pretrained import ExportFormatError, GraphTokenEncoder, HiddenSizeMismatch
from qgmem.prompting import Generation, PromptEncoder, PromptSettings, final_answer, generate, left_pad
from qgmem.serving.records import Answer, Retrieved, cited_labels, graph_json, memory_json

#: the answer when the history holds nothing at all (no memory unit was built): no LM call is made
NO_MEMORY_ANSWER = "I don't know: there is no information in the conversation history yet."


class QGMemPipeline:
    """Memory construction, activation and answering with an exported graph-token encoder."""

    def __init__(self, encoder: GraphTokenEncoder, lm: Any, tokenizer: Any, sentence_encoder: Any, *,
                 construction: ConstructionConfig | None = None, activation: ActivationConfig | None = None,
                 prompt: PromptSettings | None = None, max_new_tokens: int = 32, llm: Any = None,
                 batch_size: int = 8, backbone: Any = None):
        if int(sentence_encoder.dim) != encoder.config.feature_dim:
            expected = (encoder.export_config.get("sentence_encoder") or {}).get("id")
            raise ExportFormatError(f"the sentence encoder gives {sentence_encoder.dim}-d features, but field "
                                    f"'graph_token.feature_dim' is {encoder.config.feature_dim} (trained on "
                                    f"features of {expected!r}, field 'sentence_encoder.id')")
        self.encoder, self.lm, self.tokenizer = encoder, lm, tokenizer
        if lm is not None and needs_words(encoder.config.features):  # node_words features read the LM's embeddings
            encoder.use_word_embedding(lm.get_input_embeddings())
        self.sentence_encoder = sentence_encoder
        cfg = encoder.export_config  # settings not given explicitly are the export's
        self.construction = construction or _settings(ConstructionConfig, cfg.get("construction"), "construction",
                                                      encoder.source)
        self.activation = activation or _settings(ActivationConfig, cfg.get("activation"), "activation", encoder.source)
        self.prompt_settings = prompt or PromptSettings.from_dict(cfg.get("prompt"))
        self.prompts = PromptEncoder(tokenizer, self.prompt_settings) if tokenizer is not None else None
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.llm = llm  # construction / query-parsing LLM, when the export's settings need one
        self.backbone = backbone  # a text backbone (qgmem.serving.api) answering instead of the graph-token LM
        self.store: MemoryStore | None = None
        self._activator = None
        self._builder = None  # one MemoryBuilder per pipeline: its parser memo and models are loaded once
        self._trace_index = None  # the store's trace neighbour lists, kept for appends
        self._reranker = None  # a model reranker (cross-encoder, LLM) is loaded once, not once per store
        self.seconds: dict[str, float] = {}  # construction time of the latest remember()

    # ------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path_or_hub_id: str | Path, *, device: str | None = None, lm: str | None = None,
                        lm_dtype: str | None = None, llm: Any = None, max_new_tokens: int | None = None,
                        api: Any = None, **hub: Any) -> QGMemPipeline:
        """Rebuild everything from the export. ``lm`` overrides the LM id (e.g. a local folder of the
        same model). ``api``: an LLM backend (or an ``LLMConfig``) that answers from the working memory
        and the text-serialized graph instead of the graph-token LM (:mod:`qgmem.serving.api`); the LM is
        then not loaded. ``hub``: ``revision``, ``cache_dir``, ``local_files_only``, ``token``."""
        from qgmem.embed import SentenceEncoder

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        encoder = GraphTokenEncoder.from_pretrained(path_or_hub_id, device=device, **hub)
        cfg = encoder.export_config
        sentence = cfg.get("sentence_encoder") or {}
        sentence_encoder = SentenceEncoder(sentence.get("id"), device=device)
        gen = int(max_new_tokens or (cfg.get("generation") or {}).get("max_new_tokens") or 32)
        prompt = PromptSettings.from_dict(cfg.get("prompt"))
        backbone = model = tokenizer = None
        if api is None:
            model, tokenizer = load_lm_for(encoder, lm, lm_dtype, device)
        else:
            from qgmem.llm.base import LLMConfig
            from qgmem.serving.api import TextGraphBackbone

            if isinstance(api, LLMConfig):
                from qgmem.llm.backends import make_backend

                api = make_backend(api)
            backbone = TextGraphBackbone(api, prompt, gen, tokenizer=_tokenizer_or_none(lm or (cfg.get("lm") or {}).get("id")))
        construction = _settings(ConstructionConfig, cfg.get("construction"), "construction", path_or_hub_id)
        if llm is None and (construction.extractor == "llm" or construction.consolidation == "llm") \
                and cfg.get("construction_llm"):  # the server training's construction used, as the export records it
            from qgmem.llm.backends import make_backend
            from qgmem.llm.base import LLMConfig

            try:
                llm_config = LLMConfig(**cfg["construction_llm"])
            except TypeError as exc:
                raise ExportFormatError(f"{path_or_hub_id}: field 'construction_llm' cannot be read by this qgmem: "
                                        f"{exc}") from exc
            llm = make_backend(llm_config)
        return cls(encoder, model, tokenizer, sentence_encoder, backbone=backbone, construction=construction,
                   activation=_settings(ActivationConfig, cfg.get("activation"), "activation", path_or_hub_id),
                   prompt=prompt, llm=llm, max_new_tokens=gen)

    # -------------------------------------------------------------------------------------- memory
    def remember(self, history: Any, *, append: bool = False) -> MemoryStore:
        """Build the memory store of ``history``: a :class:`~qgmem.data.records.Dialogue` or ``Case``, a
        plain list of sessions, or a path to a history file (see :mod:`qgmem.serving.history_file`).

        ``append=True`` adds ``history``'s sessions to the current store instead (new units, traces
        regrouped, indexes extended; the earlier history is not rebuilt): appending a history's sessions
        one call at a time gives the store of remembering it in one call.
        """
        from qgmem.data.records import Case, Dialogue
        from qgmem.serving.history_file import load_history, sessions_to_dialogue

        if isinstance(history, (str, Path)):
            history = load_history(history)
        if isinstance(history, Case):
            history = history.dialogue
        if not isinstance(history, Dialogue):
            history = sessions_to_dialogue(history)
        builder = self.builder()
        started = time.perf_counter()
        previous = None
        if append and self.store is not None:
            store, self._trace_index = builder.append(self.store, history.sessions, self._trace_index)
            previous = self._activator
        else:
            index: list = []
            store = builder.build(history, index_out=index)
            self._trace_index = index[0]
        self.seconds = {"construction": time.perf_counter() - started}
        return self.use_store(store, self._trace_index, previous)

    def builder(self):
        """The pipeline's :class:`~qgmem.memory.builder.MemoryBuilder` (made once, on first use)."""
        from qgmem.memory.builder import MemoryBuilder

        if self._builder is None:
            if (self.construction.extractor == "llm" or self.construction.consolidation == "llm") and self.llm is None:
                raise UserError("the export's construction settings use an LLM (field 'construction.extractor' or "
                                "'construction.consolidation'); pass llm=<backend> or build the store with "
                                "`qgmem build-memory` and use load_memory()")
            self._builder = MemoryBuilder(self.construction, self.sentence_encoder, llm=self.llm)
        return self._builder

    def load_memory(self, folder: str | Path, dialogue_id: str | None = None) -> MemoryStore:
        """Reuse a store written by ``qgmem build-memory`` (its ``--out`` folder, or one store folder):
        chosen by its index (:func:`qgmem.memory.output.load_built_store`), never "the only one readable"."""
        from qgmem.memory.output import load_built_store

        return self.use_store(load_built_store(folder, dialogue_id))

    def use_store(self, store: MemoryStore, trace_index: Any = None, previous: Any = None) -> MemoryStore:
        self.store = store
        self._trace_index = trace_index  # None: rebuilt from the store at the first append
        self._activator = self.activator_for(store, previous)
        return store

    def activator_for(self, store: MemoryStore, previous: Any = None):
        """An :class:`~qgmem.activation.activator.Activator` over ``store`` (None for an empty store),
        sharing the pipeline's model reranker when the activation settings use one. ``previous``: the
        activator of the store before an append, extended instead of rebuilt (then unusable)."""
        from qgmem.activation.activator import Activator
        from qgmem.activation.rerank import make_reranker

        if not len(store):
            return None
        if self.activation.reranker != "embedding" and self._reranker is None:
            a = self.activation
            self._reranker = make_reranker(a.reranker, embeddings=store.embeddings, encoder=self.sentence_encoder,
                                           path=a.reranker_path, batch_size=a.reranker_batch_size,
                                           max_doc_tokens=a.reranker_max_doc_tokens)
        if previous is not None:
            return previous.extended(store, reranker=self._reranker)
        return Activator(store, self.sentence_encoder, self.activation, reranker=self._reranker, llm=self.llm)

    # ------------------------------------------------------------------------------------ answering
    def retrieve(self, questions: Sequence[str], question_times: Sequence[str | None] | None = None) -> list[Retrieved]:
        """Activation + graph features for each question (no LM yet)."""
        if self.store is None:
            raise UserError("no memory yet: call remember(history) or load_memory(folder) first")
        times = list(question_times) if question_times is not None else [None] * len(questions)
        return [self.retrieve_one(self._activator, len(self.store), q, when) for q, when in zip(questions, times)]

    def retrieve_one(self, activator: Any, store_units: int, question: str, when: str | None = None) -> Retrieved:
        """Activation (over ``activator``'s store; None: an empty memory) + graph features, one question."""
        from qgmem.activation.graph import graph_to_data
        from qgmem.model.alignment import node_word_ids
        from qgmem.model.features import needs_fact

        t0 = time.perf_counter()
        memory = WorkingMemory(question=question) if activator is None else activator.activate(question, when)
        t1 = time.perf_counter()
        facts = [u.fact for u in memory.units] if needs_fact(self.encoder.config.features) else None
        graph = graph_to_data(memory.graph, self.sentence_encoder, facts=facts)
        if needs_words(self.encoder.config.features) and self.backbone is None:  # an API backbone reads text
            graph.node_word_ids = node_word_ids([memory.graph.node_text], [int(graph.num_nodes)], self.tokenizer)
        return Retrieved(question, memory, graph, {"activation": t1 - t0,
                                                   "graph_features": time.perf_counter() - t1}, when, store_units)

    def answer(self, questions: str | Sequence[str], graph: str = "token",
               question_times: Sequence[str | None] | None = None) -> list[Answer]:
        """Batched answers for ``questions`` over the current memory (``graph``: token | none | shuffled)."""
        questions = [questions] if isinstance(questions, str) else list(questions)
        return self.generate(self.retrieve(questions, question_times), graph=graph)

    def generate(self, retrieved: Sequence[Retrieved], graph: str = "token", streamer: Any = None) -> list[Answer]:
        """Answers for activated questions; ``shuffled`` pairs question ``i`` with question ``i+1``'s graph
        (a single question gets the empty graph). ``streamer``: a ``transformers`` streamer given each
        decoding step's tokens (``[batch]``) of one batch; pass at most ``batch_size`` questions with it."""
        try:
            check_mode(graph)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if self.backbone is not None:
            return self.backbone.generate(retrieved, graph)
        graphs = self._graphs_for(retrieved, graph)
        answers: list[Answer] = []
        for start in range(0, len(retrieved), self.batch_size):
            answers.extend(self._generate_batch(retrieved[start:start + self.batch_size],
                                                graphs[start:start + self.batch_size], graph, streamer))
        return answers

    def _graphs_for(self, retrieved: Sequence[Retrieved], mode: str) -> list[Data | None]:
        if mode == "none":
            return [None] * len(retrieved)
        graphs = [r.graph for r in retrieved]
        if mode == "shuffled":
            cfg = self.encoder.config
            graphs = shuffled(graphs, alone=empty_graph(cfg.feature_dim, cfg.edge_dim))
        return graphs

    def encode_prompts(self, retrieved: Sequence[Retrieved]):
        encoded = []
        for r in retrieved:
            p = self.prompts.prompt(r.memory.text, r.question)
            if p.overflow:
                raise UserError(f"the question is too long: its prompt is {p.overflow} tokens over the export's "
                                f"context budget (prompt.max_prompt_tokens = {self.prompt_settings.max_prompt_tokens}) "
                                "even with no memory text; shorten the question")
            encoded.append(p)
        return encoded

    @torch.no_grad()
    def _generate_batch(self, batch: Sequence[Retrieved], graphs: list[Data | None], mode: str,
                        streamer: Any = None) -> list[Answer]:
        from qgmem.model.fusion import insert_token

        encoded = self.encode_prompts(batch)
        has_memory = [r.store_units > 0 for r in batch]
        t0 = time.perf_counter()
        ids, mask = left_pad([p.ids for p in encoded], self.prompts.pad_id)
        device = self.lm.device
        ids, mask = ids.to(device), mask.to(device)
        pos = torch.tensor([p.graph_pos + ids.size(1) - len(p.ids) for p in encoded], device=device)
        token = self.encoder.encode(graphs) if mode != "none" else None
        t1 = time.perf_counter()
        embeds = self.lm.get_input_embeddings()(ids)
        embeds, mask, _, _ = insert_token(embeds, mask, pos, token)
        settings = self.prompt_settings
        caps = [self.answer_cap(r) for r in batch]
        newline = settings.first_line and not settings.enable_thinking
        if any(has_memory):
            out = generate(self.lm, self.tokenizer, mask, inputs_embeds=embeds, max_new_tokens=max(caps),
                           stop_ids=self.prompts.stop_ids, pad_id=self.prompts.pad_id,
                           stop_at_newline=newline, streamer=streamer, prefix_ids=self.prompts.head_ids)
            out, finish = self._cut(out, caps, newline)
        else:  # nothing was remembered: the honest answer needs no LM call
            out, finish = Generation([[] for _ in batch], ["" for _ in batch]), ["stop"] * len(batch)
        t2 = time.perf_counter()
        n = len(batch)
        graph_slots = 0 if token is None else (token.size(1) if token.dim() == 3 else 1)
        answers = []
        for r, p, text, n_new, memory_present, reason in zip(batch, encoded, out.texts, out.num_tokens, has_memory,
                                                             finish):
            answer = final_answer(text, settings.first_line) if memory_present else NO_MEMORY_ANSWER
            seconds = {**r.seconds, "graph_encoding": (t1 - t0) / n, "generation": (t2 - t1) / n}
            seconds["total"] = sum(seconds.values())
            tokens = {"retrieved_context": p.memory_tokens, "prompt": len(p.ids), "graph": graph_slots,
                      "generated": n_new if memory_present else 0}
            tokens["total"] = tokens["prompt"] + tokens["graph"] + tokens["generated"]
            answers.append(Answer(r.question, answer, mode, cited_labels(answer, len(r.memory.units)),
                                  memory_json(r.memory), graph_json(r.memory.graph), seconds, tokens,
                                  p.memory_tokens_dropped, finish_reason=reason))
        return answers

    def answer_cap(self, retrieved: Retrieved) -> int:
        """The question's answer cap: its own ``max_new_tokens`` when given, never above the pipeline's."""
        asked = retrieved.max_new_tokens
        return self.max_new_tokens if asked is None else max(1, min(int(asked), self.max_new_tokens))

    def _cut(self, out: Generation, caps: list[int], newline: bool) -> tuple[Generation, list[str]]:
        """Each row cut at its own cap (the batch ran to the largest; greedy rows do not depend on each
        other), and why it ended: ``"stop"`` (a stop token or, with ``newline``, a line break within
        the cap) or ``"length"`` (the cap reached first)."""
        stops = set(self.prompts.stop_ids)
        rows, texts, finish = [], [], []
        for row, text, cap in zip(out.ids, out.texts, caps):
            if len(row) > cap:
                row = row[:cap]
                text = self.tokenizer.decode(row, skip_special_tokens=True)
            ended = any(t in stops for t in row) or (newline and "\n" in text)
            rows.append(row)
            texts.append(text)
            finish.append("length" if not ended and len(row) >= cap else "stop")
        return Generation(rows, texts), finish


def load_lm_for(encoder: GraphTokenEncoder, lm: str | None, lm_dtype: str | None, device: str):
    """The frozen LM the export was trained against (its LoRA adapters applied), and its tokenizer."""
    from qgmem.lm import load_causal_lm, load_tokenizer

    cfg = encoder.export_config
    lm_cfg = cfg.get("lm") or {}
    lm_id = lm or lm_cfg.get("id")
    if not lm_id:
        raise ExportFormatError("the export's config has no field 'lm.id': the LM it was trained against is unknown")
    model = load_causal_lm(lm_id, dtype=lm_dtype or lm_cfg.get("load_dtype") or "auto", device=device)
    hidden = model.get_input_embeddings().embedding_dim
    if hidden != encoder.config.lm_hidden:
        raise HiddenSizeMismatch(f"field 'graph_token.lm_hidden' is {encoder.config.lm_hidden} (trained for "
                                 f"{lm_cfg.get('id')!r}) but LM {lm_id!r} has {hidden}-d embeddings")
    if cfg.get("lora"):
        adapter = encoder.adapter_dir
        if adapter is None:
            raise ExportFormatError(f"field 'lora' is set but the export has no lora_adapter/ folder "
                                    f"({encoder.source}); serving without the adapters would not be this model")
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        model.eval()
    return model, load_tokenizer(lm_id, padding_side="left")


def _tokenizer_or_none(lm_id: str | None):
    """The export LM's tokenizer for counting tokens, when it loads offline (an API run may lack it)."""
    if not lm_id:
        return None
    try:
        from qgmem.lm import load_tokenizer

        return load_tokenizer(lm_id)
    except Exception:  # noqa: BLE001 - counting falls back to words; answering does not need it
        return None


def _settings(kind, values: dict[str, Any] | None, name: str, source: Any):
    try:
        return kind.from_dict(values) if values else kind()
    except (TypeError, ValueError) as exc:
        raise ExportFormatError(f"{source}: field '{name}' cannot be read by this qgmem: {exc}") from exc
