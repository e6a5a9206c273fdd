"""``QGMemPipeline``: from an export (folder or hub id) and a dialogue history to answers.

Everything is rebuilt from the export alone: the sentence encoder, the construction and activation
settings, the graph encoder + projector and the frozen LM (with its LoRA adapters when the run had
them). The pipeline is the engine: it holds the models and answers a question against a
:class:`~qgmem.activation.memory.Memory` (a dialogue's store, trace index and activator), which it
builds from a history but does not own: ``qgmem serve`` keeps one per user, ``eval-qa`` one per case.
For a single dialogue, :meth:`QGMemPipeline.remember` keeps one as :attr:`QGMemPipeline.memory`.
A question then goes through the same steps as in training: activation over the memory store,
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
from qgmem.activation.answer_contract import AnswerContract
from qgmem.activation.memory import Memory
from qgmem.model.graph_modes import empty_graph
from qgmem.errors import SettingError, UserError
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.store import MemoryStore
from qgmem.model.features import needs_words
from qgmem.model.graph_modes import check_mode, shuffled
from qgmem.model.pretrained import ExportFormatError, GraphTokenEncoder, HiddenSizeMismatch
from qgmem.prompting import Generation, PromptEncoder, PromptSettings, final_answer, generate, left_pad
from qgmem.prompting.answer import holds_answer_line, reply_shape
from qgmem.serving.records import Answer, Retrieved, cited_labels, graph_json, memory_json
from qgmem.serving.remote_lm import RemoteLM

#: the answer when the history holds nothing at all (no memory unit was built): no LM call is made
NO_MEMORY_ANSWER = "I don't know: there is no information in the conversation history yet."


class QGMemPipeline:
    """The models of an export: memories built from histories, questions retrieved against a memory, answers."""

    def __init__(self, encoder: GraphTokenEncoder, lm: Any, tokenizer: Any, sentence_encoder: Any, *,
                 construction: ConstructionConfig | None = None, contract: AnswerContract | None = None,
                 max_new_tokens: int = 32, llm: Any = None,
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
        #: what an answer depends on (prompt and budgets, activation, graph mode): the export's
        #: unless given, validated once where it is made
        self.contract = contract or _contract(cfg, encoder.source)
        self.prompts = PromptEncoder(tokenizer, self.prompt_settings) if tokenizer is not None else None
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.llm = llm  # construction / query-parsing LLM, when the export's settings need one
        self.backbone = backbone  # a text backbone (qgmem.serving.text_graph_backbone) answering instead of the graph-token LM
        self.memory: Memory | None = None  # what answer() and retrieve() read when given no memory
        self._builder = None  # one MemoryBuilder per pipeline: its parser memo and models are loaded once
        self._reranker = None  # a model reranker (cross-encoder, LLM) is loaded once, not once per memory

    @property
    def activation(self) -> ActivationConfig:
        """The contract's activation."""
        return self.contract.activation

    @property
    def prompt_settings(self) -> PromptSettings:
        """The contract's prompt."""
        return self.contract.prompt

    # ------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path_or_hub_id: str | Path, *, device: str | None = None, lm: str | None = None,
                        lm_dtype: str | None = None, llm: Any = None, max_new_tokens: int | None = None,
                        api: Any = None, engine: Any = None, **hub: Any) -> QGMemPipeline:
        """Rebuild everything from the export. ``lm`` overrides the LM id (e.g. a local folder of the
        same model). ``api``: an LLM backend (or an ``LLMConfig``) that answers from the working memory
        and the text-serialized graph instead of the graph-token LM (:mod:`qgmem.serving.text_graph_backbone`); the LM is
        then not loaded. ``engine``: the ``LLMConfig`` of a serving engine that runs the LM
        (:mod:`qgmem.serving.remote_lm`); only its input embedding table is loaded here. ``hub``:
        ``revision``, ``cache_dir``, ``local_files_only``, ``token``."""
        from qgmem.embed import SentenceEncoder

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        encoder = GraphTokenEncoder.from_pretrained(path_or_hub_id, device=device, **hub)
        cfg = encoder.export_config
        sentence = cfg.get("sentence_encoder") or {}
        sentence_encoder = SentenceEncoder(sentence.get("id"), device=device)
        gen = int(max_new_tokens or (cfg.get("generation") or {}).get("max_new_tokens") or 32)
        contract = _contract(cfg, path_or_hub_id)
        backbone = model = tokenizer = None
        if api is None:
            model, tokenizer = load_lm_for(encoder, lm, lm_dtype, device, engine)
        else:
            from qgmem.llm.base import LLMConfig
            from qgmem.serving.text_graph_backbone import TextGraphBackbone

            if isinstance(api, LLMConfig):
                from qgmem.llm.backends import make_backend

                api = make_backend(api)
            backbone = TextGraphBackbone(api, contract.prompt, gen, tokenizer=_tokenizer_or_none(lm or (cfg.get("lm") or {}).get("id")))
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
                   contract=contract, llm=llm, max_new_tokens=gen)

    # -------------------------------------------------------------------------------------- memory
    def build_memory(self, history: Any) -> Memory:
        """The :class:`~qgmem.activation.memory.Memory` of ``history``: a :class:`~qgmem.data.records.Dialogue`
        or ``Case``, a plain list of sessions, or a path to a history file (see
        :mod:`qgmem.serving.history_file`), built with the export's construction settings."""
        from qgmem.serving.history_file import as_dialogue

        return Memory.build(self.builder(), as_dialogue(history), self.activation, reranker=self.shared_reranker())

    def open_memory(self, store: MemoryStore) -> Memory:
        """A :class:`~qgmem.activation.memory.Memory` over a store already built (loaded from disk, or
        changed by the caller), read with the export's activation settings."""
        return Memory(store, self.sentence_encoder, self.activation, reranker=self.shared_reranker(), llm=self.llm)

    def remember(self, history: Any, *, append: bool = False) -> MemoryStore:
        """Build the memory that :meth:`answer` and :meth:`retrieve` read when given none (:attr:`memory`)
        from ``history`` (any form :meth:`build_memory` takes); returns its store.

        ``append=True`` adds ``history``'s sessions to the current memory instead (new units, traces
        regrouped, indexes extended; the earlier history is not rebuilt): appending a history's sessions
        one call at a time gives the store of remembering it in one call.
        """
        from qgmem.serving.history_file import as_dialogue

        if append and self.memory is not None:
            self.memory = self.memory.appended(self.builder(), as_dialogue(history).sessions)
        else:
            self.memory = self.build_memory(history)
        return self.memory.store

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

    def shared_reranker(self):
        """The activation settings' model reranker, loaded once for every memory (``None``: the embedding one)."""
        from qgmem.activation.rerank import shared_reranker

        if self._reranker is None:
            self._reranker = shared_reranker(self.activation)
        return self._reranker

    def load_memory(self, folder: str | Path, dialogue_id: str | None = None) -> MemoryStore:
        """Reuse a store written by ``qgmem build-memory`` (its ``--out`` folder, or one store folder) as
        :attr:`memory`: chosen by its index (:func:`qgmem.memory.output.load_built_store`), never "the
        only one readable"."""
        from qgmem.memory.output import load_built_store

        self.memory = self.open_memory(load_built_store(folder, dialogue_id))
        return self.memory.store

    # ------------------------------------------------------------------------------------ answering
    def retrieve(self, questions: Sequence[str], question_times: Sequence[str | None] | None = None,
                 memory: Memory | None = None) -> list[Retrieved]:
        """Activation + graph features for each question over ``memory`` (default: :attr:`memory`; no LM yet)."""
        memory = self.memory if memory is None else memory
        if memory is None:
            raise UserError("no memory yet: call remember(history) or load_memory(folder) first")
        times = list(question_times) if question_times is not None else [None] * len(questions)
        return [self.retrieve_one(memory, q, when) for q, when in zip(questions, times)]

    def retrieve_one(self, memory: Memory, question: str, when: str | None = None) -> Retrieved:
        """Activation over ``memory`` + graph features, one question."""
        from qgmem.model.alignment import node_word_ids
        from qgmem.model.features import needs_fact

        working, graph, seconds = memory.recall(question, when, facts=needs_fact(self.encoder.config.features))
        if needs_words(self.encoder.config.features) and self.backbone is None:  # an API backbone reads text
            graph.node_word_ids = node_word_ids([working.graph.node_text], [int(graph.num_nodes)], self.tokenizer)
        return Retrieved(question, working, graph, seconds, when, len(memory))

    def answer(self, questions: str | Sequence[str], graph_mode: str | None = None,
               question_times: Sequence[str | None] | None = None, memory: Memory | None = None) -> list[Answer]:
        """Batched answers for ``questions`` over ``memory`` (default: :attr:`memory`; ``graph_mode``: token |
        none | shuffled, default the contract's ``graph_mode``, the export's)."""
        questions = [questions] if isinstance(questions, str) else list(questions)
        return self.generate(self.retrieve(questions, question_times, memory), graph_mode=graph_mode)

    def generate(self, retrieved: Sequence[Retrieved], graph_mode: str | None = None,
                 streamer: Any = None) -> list[Answer]:
        """Answers for activated questions (``graph_mode`` ``None``: the contract's); ``shuffled`` pairs
        question ``i`` with question ``i+1``'s graph (a single question gets the empty graph). ``streamer``:
        a ``transformers`` streamer given each decoding step's tokens (``[batch]``) of one batch; pass at most
        ``batch_size`` questions with it."""
        graph_mode = self.contract.graph_mode if graph_mode is None else graph_mode
        try:
            check_mode(graph_mode)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if self.backbone is not None:
            return self.backbone.generate(retrieved, graph_mode)
        graphs = self._graphs_for(retrieved, graph_mode)
        answers: list[Answer] = []
        for start in range(0, len(retrieved), self.batch_size):
            answers.extend(self._generate_batch(retrieved[start:start + self.batch_size],
                                                graphs[start:start + self.batch_size], graph_mode, streamer))
        return answers

    def _graphs_for(self, retrieved: Sequence[Retrieved], graph_mode: str) -> list[Data | None]:
        if graph_mode == "none":
            return [None] * len(retrieved)
        graphs = [r.graph for r in retrieved]
        if graph_mode == "shuffled":
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
    def _generate_batch(self, batch: Sequence[Retrieved], graphs: list[Data | None], graph_mode: str,
                        streamer: Any = None) -> list[Answer]:
        from qgmem.model.fusion import insert_token
        from qgmem.model.kv_prefix import KVPrefix, reading

        encoded = self.encode_prompts(batch)
        has_memory = [r.store_units > 0 for r in batch]
        t0 = time.perf_counter()
        ids, mask = left_pad([p.ids for p in encoded], self.prompts.pad_id)
        device = self.lm.device
        ids, mask = ids.to(device), mask.to(device)
        pos = torch.tensor([p.graph_pos + ids.size(1) - len(p.ids) for p in encoded], device=device)
        token = self.encoder.encode(graphs) if graph_mode != "none" else None
        t1 = time.perf_counter()
        embeds = self.lm.get_input_embeddings()(ids)
        embeds, mask, _, _ = insert_token(embeds, mask, pos, token)
        settings = self.prompt_settings
        caps = [self.answer_cap(r) for r in batch]
        newline = settings.first_line and not settings.enable_thinking
        if any(has_memory) and isinstance(self.lm, RemoteLM):
            texts, counts, finish = self.lm.answer(embeds, mask, caps, self.prompts.stop_ids, newline, streamer)
        elif any(has_memory):
            with reading(self.lm, token, pos):  # a key/value prefix, read at every layer (nothing for input)
                out = generate(self.lm, self.tokenizer, mask, inputs_embeds=embeds, max_new_tokens=max(caps),
                               stop_ids=self.prompts.stop_ids, pad_id=self.prompts.pad_id,
                               stop_at_newline=newline, streamer=streamer, prefix_ids=self.prompts.head_ids)
            out, finish = self._cut(out, caps, newline)
            texts, counts = out.texts, out.num_tokens
        else:  # nothing was remembered: the honest answer needs no LM call
            texts, counts, finish = [""] * len(batch), [0] * len(batch), ["stop"] * len(batch)
        t2 = time.perf_counter()
        n = len(batch)
        graph_slots = 0 if token is None else token.num_slots if isinstance(token, KVPrefix) else \
            (token.size(1) if token.dim() == 3 else 1)
        answers = []
        for r, p, text, n_new, memory_present, reason in zip(batch, encoded, texts, counts, has_memory, finish):
            answer = final_answer(text, settings.first_line) if memory_present else NO_MEMORY_ANSWER
            seconds = {**r.seconds, "graph_encoding": (t1 - t0) / n, "generation": (t2 - t1) / n}
            seconds["total"] = sum(seconds.values())
            tokens = {"retrieved_context": p.memory_tokens, "prompt": len(p.ids), "graph": graph_slots,
                      "generated": n_new if memory_present else 0}
            tokens["total"] = tokens["prompt"] + tokens["graph"] + tokens["generated"]
            answers.append(Answer(r.question, answer, graph_mode, cited_labels(answer, len(r.memory.units)),
                                  memory_json(r.memory), graph_json(r.memory.graph), seconds, tokens,
                                  p.memory_tokens_dropped, finish_reason=reason,
                                  reply_shape=reply_shape(text) if memory_present else None))
        return answers

    def answer_cap(self, retrieved: Retrieved) -> int:
        """The question's answer cap: its own ``max_new_tokens`` when given, never above the pipeline's."""
        asked = retrieved.max_new_tokens
        return self.max_new_tokens if asked is None else max(1, min(int(asked), self.max_new_tokens))

    def _cut(self, out: Generation, caps: list[int], newline: bool) -> tuple[Generation, list[str]]:
        """Each row cut at its own cap (the batch ran to the largest; greedy rows do not depend on each
        other), and why it ended: ``"stop"`` (a stop token or, with ``newline``, a line break after an
        answer line within the cap) or ``"length"`` (the cap reached first)."""
        stops = set(self.prompts.stop_ids)
        rows, texts, finish = [], [], []
        for row, text, cap in zip(out.ids, out.texts, caps):
            if len(row) > cap:
                row = row[:cap]
                text = self.tokenizer.decode(row, skip_special_tokens=True)
            ended = any(t in stops for t in row) or (newline and holds_answer_line(text))
            rows.append(row)
            texts.append(text)
            finish.append("length" if not ended and len(row) >= cap else "stop")
        return Generation(rows, texts), finish


def load_lm_for(encoder: GraphTokenEncoder, lm: str | None, lm_dtype: str | None, device: str, engine: Any = None):
    """The frozen LM the export was trained against (its LoRA adapters applied), and its tokenizer.

    ``engine`` (an ``LLMConfig``): the LM runs in a serving engine; a :class:`RemoteLM` holding the input
    embedding table alone stands in for it.
    """
    from qgmem.lm import load_causal_lm, load_tokenizer

    cfg = encoder.export_config
    lm_cfg = cfg.get("lm") or {}
    lm_id = lm or lm_cfg.get("id")
    if not lm_id:
        raise ExportFormatError("the export's config has no field 'lm.id': the LM it was trained against is unknown")
    dtype = lm_dtype or lm_cfg.get("load_dtype") or "auto"
    if engine is not None:
        if (cfg.get("graph_token") or {}).get("injection", "input") != "input":
            raise ExportFormatError(f"{encoder.source}: the export writes the graph as keys and values at every "
                                    "layer (field 'graph_token.injection' = 'kv_prefix'), which --lm-url cannot send "
                                    "through the engine's prompt-embeddings API; serve this export in process "
                                    "(without --lm-url)")
        if cfg.get("lora"):
            raise ExportFormatError(f"{encoder.source}: the export adapts the LM with LoRA (field 'lora'), and an "
                                    "engine behind --lm-url runs the LM without the adapters; serve this export "
                                    "in process (without --lm-url)")
        model = RemoteLM.load(lm_id, engine, dtype=dtype, device=device)
    else:
        model = load_causal_lm(lm_id, dtype=dtype, device=device)
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


def _contract(config: dict[str, Any], source: Any) -> AnswerContract:
    """The export's answer contract; one that does not read or hold together names the export."""
    try:
        return AnswerContract.from_export_config(config)
    except SettingError as exc:
        raise ExportFormatError(f"{source}: {exc}") from exc


def _settings(kind, values: dict[str, Any] | None, name: str, source: Any):
    try:
        return kind.from_dict(values) if values else kind()
    except (TypeError, ValueError) as exc:
        raise ExportFormatError(f"{source}: field '{name}' cannot be read by this qgmem: {exc}") from exc
