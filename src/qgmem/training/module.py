"""``QGMemModule``: train the graph encoder + projector against a frozen causal LM (paper §III-C).

The LM stays frozen, in eval mode and in its own dtype; only the graph-token network (and optional LoRA
adapters, off by default) train. The loss is the answer tokens' cross-entropy with the LM head applied
only at answer positions. The prompt comes from the run's answer contract, which the data module makes
and the module adopts once per stage (``setup``). Checkpoints hold the trainable weights, optimizer
state, hyperparameters and that contract; the LM is rebuilt from its id on load, so a checkpoint of an 8B-LM run stays a few megabytes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.model_helpers import _restricted_classmethod
from torch_geometric.data import Batch

from qgmem.activation.answer_contract import AnswerContract
from qgmem.model.graph_modes import empty_graph
from qgmem.errors import SettingError
from qgmem.lm import EMBEDDED_LM, load_causal_lm, load_tokenizer
from qgmem.model import checkpoint_keys as CK
from qgmem.model.encoder import EncoderConfig
from qgmem.model.features import GraphFeatures
from qgmem.model.fusion import IGNORE_INDEX, answer_logits, answer_nll, insert_token, shared_prefix_length
from qgmem.model.graph_modes import GraphMode, check_mode, shuffled
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model.kv_prefix import INJECTIONS, Injection, kv_scale, lm_kv_shape, reading
from qgmem.model.readout import Readout
from qgmem.prompting import PromptEncoder, final_answer, generate
from qgmem.provenance import provenance
from qgmem.training.metrics import AnswerScores
from qgmem.training.records import EvalRecords, by_category
from qgmem.training.stages import AnswerLogits, NodeWordAlignment, Stage, as_stage, check_stages, stage_record

# The frozen LM is absent from checkpoints and in eval mode during fit, both on purpose.
warnings.filterwarnings("ignore", message="Found keys that are in the model state dict but not in the checkpoint")
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")

#: ``--optimizer`` and ``--lr_scheduler`` of a run that names none (LightningCLI's class_path + init_args;
#: the init_args left out are the classes' own defaults: AdamW's lr 1e-3 and weight decay 0.01)
DEFAULT_OPTIMIZER = {"class_path": "torch.optim.AdamW"}
DEFAULT_LR_SCHEDULER = {"class_path": "qgmem.training.schedule.WarmupCosine"}
#: hyperparameters that older checkpoints kept as flat settings (the blocks) or under an older name (read
#: through ``older_records``)
MODULE_BLOCKS = ("stages", "generation", "graph_mode")


@dataclass
class LoraSettings:
    """LoRA on the frozen LM through ``peft`` (an extension; the paper trains only encoder + projector).

    Args:
        r: Rank of the adapter matrices.
        alpha: Scaling numerator (the update is scaled by ``alpha / r``).
        dropout: Dropout on the adapter's input.
        target_modules: Names of the LM's linear layers that get adapters.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class GenerationSettings:
    """How validation and test decode answers for EM/F1 (one block, so the module's signature stays small).

    Args:
        max_new_tokens: Greedy generation length for EM/F1 (also the export's default answer length).
        val_generate_batches: Validation batches (per process) that are also decoded and scored.
        test_generate_batches: Test batches (per process) that are decoded and scored (``None`` = all).
        num_examples: Generations logged as text per validation epoch.
    """

    max_new_tokens: int = 32
    val_generate_batches: int = 2
    test_generate_batches: int | None = None
    num_examples: int = 4


def _plain(value: Any) -> Any:
    """Dataclasses → dicts, so hyperparameters stay plain data in checkpoints and YAML."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


class QGMemModule(LightningModule):
    """Graph-token training over a frozen LM; batches come from ``GraphTextCollator``.

    The defaults are the product's: ``python train.py`` trains them, and its preset changes only the
    CPU budget (and lists the stages, the signature's). The paper's network is ``features: text``,
    ``readout: mean``, ``num_graph_tokens: 1`` and no stages (preset ``qwen3_8b``). The default readout,
    ``summary_nodes`` with 17 tokens (the paper's pooled token, then the first 16 nodes), had the lowest
    validation answer NLL in the setting ``train.py`` runs among the paper's token, ``nodes`` (16) and
    itself; docs/BENCHMARKS.md holds that table and the learning check.

    Args:
        lm: Causal LM id, local folder, or ``embedded:SmolLM2-135M-Instruct``.
        lm_dtype: Dtype the frozen LM is loaded in (``auto`` = the checkpoint's; ``bfloat16`` on GPU).
        feature_dim: Sentence-encoder dimension = node and edge feature width (linked from the data).
        encoder: Graph encoder shape.
        projector_hidden: Projector's inner width (``None`` = max(encoder width, LM width)).
        features: Memory content the encoder reads (``text`` = the paper's node/predicate texts;
            ``edge_fact_sum``/``edge_fact_concat``/``node_fact`` add each unit's fact embedding, see
            :mod:`qgmem.model.features`).
        readout: ``mean`` (one token, the paper), ``queries`` (``num_graph_tokens`` learned queries over
            the nodes → that many graph tokens), ``nodes`` (the first ``num_graph_tokens`` nodes in
            working-memory order, one token each) or ``summary_nodes`` (the mean token, then the first
            ``num_graph_tokens - 1`` nodes).
        num_graph_tokens: Graph tokens of the ``queries``, ``nodes``, ``summary_nodes`` and ``summary_units``
            readouts (1 with ``mean``; ``summary_units`` over ``k_graph`` units: ``1 + k_graph``).
        injection: Where the graph enters the frozen LM: ``input`` (the ``K`` graph tokens among the input
            embeddings) or ``kv_prefix`` (``K`` positions of keys and values at every layer, written by the
            projector at the same slot; :mod:`qgmem.model.kv_prefix`). ``kv_prefix`` trains without the
            ``NodeWordAlignment`` stage (it fits input embeddings) and without gradient checkpointing.
        graph_mode: ``token`` (QGMem), ``none`` (text only, same pipeline) or ``shuffled`` (another sample's
            graph token), so the graph token's contribution is measurable.
        stages: The recipe beside the answer loss (:mod:`qgmem.training.stages`): pre-training phases run
            before answer training and terms added to the loss each step, in list order (``None`` = the
            product's: :class:`~qgmem.training.stages.NodeWordAlignment` with its defaults; ``[]`` = the
            answer loss alone). Each is a stage object or its ``{class_path, init_args}`` record.
        generation: How validation and test decode answers (:class:`GenerationSettings`:
            ``max_new_tokens``, ``val_generate_batches``, ``test_generate_batches``, ``num_examples``).
        gradient_checkpointing: Recompute LM layers in backward (long contexts); the LM stays in eval mode.
        lora: LoRA adapters on the frozen LM (``None`` = off).
        optimizer: The optimizer as ``{class_path, init_args}`` (linked from the CLI's ``--optimizer``;
            ``None`` = :data:`DEFAULT_OPTIMIZER`), built over the trainable parameters.
        lr_scheduler: The schedule as ``{class_path, init_args}`` (linked from ``--lr_scheduler``;
            ``None`` = :data:`DEFAULT_LR_SCHEDULER`), stepped every optimizer step; a class taking
            ``total_steps`` gets the run's estimated steps.
        init_from: Start the encoder and projector from these weights: an export folder, or a
            ``graph_encoder.safetensors`` such as the one the pre-training phase saves under
            ``<default_root_dir>/alignment/`` (names and shapes must match this network's).
    """

    def __init__(self, lm: str = EMBEDDED_LM, lm_dtype: str = "auto", feature_dim: int = 384,
                 encoder: EncoderConfig = EncoderConfig(), projector_hidden: int | None = None,
                 features: GraphFeatures = "node_words", readout: Readout = "summary_nodes", num_graph_tokens: int = 17,
                 injection: Injection = "input",
                 graph_mode: GraphMode = "token", stages: list[Stage] | None = None,
                 generation: GenerationSettings = GenerationSettings(), gradient_checkpointing: bool = False,
                 lora: LoraSettings | None = None,
                 optimizer: dict[str, Any] | None = None, lr_scheduler: dict[str, Any] | None = None,
                 init_from: str | None = None):
        super().__init__()
        self.stages = [as_stage(s) for s in ([NodeWordAlignment()] if stages is None else stages)]
        check_stages(self.stages)
        _check_injection(injection, self.stages, gradient_checkpointing)
        # a misspelt class fails here, not after the cache build
        _class_of(optimizer or DEFAULT_OPTIMIZER, torch.optim.Optimizer, "optimizer")
        _class_of(lr_scheduler or DEFAULT_LR_SCHEDULER, torch.optim.lr_scheduler.LRScheduler, "lr_scheduler")
        encoder = EncoderConfig(**encoder) if isinstance(encoder, dict) else encoder
        lora = LoraSettings(**lora) if isinstance(lora, dict) else lora
        self.generation = GenerationSettings(**generation) if isinstance(generation, dict) else generation
        check_mode(graph_mode)
        self.save_hyperparameters()
        self.hparams["encoder"], self.hparams["lora"] = _plain(encoder), _plain(lora)
        self.hparams["generation"] = _plain(self.generation)
        self.hparams["stages"] = [stage_record(s) for s in self.stages]  # what the checkpoint was trained with

        self.lm = load_causal_lm(lm, dtype=lm_dtype)
        self.tokenizer = load_tokenizer(lm)
        lm_hidden = self.lm.get_input_embeddings().embedding_dim
        kv = dict(zip(("lm_layers", "lm_kv_width"), lm_kv_shape(self.lm))) if injection == "kv_prefix" else {}
        self.net = GraphTokenNet(GraphTokenConfig(feature_dim=feature_dim, edge_dim=feature_dim, lm_hidden=lm_hidden,
                                                  encoder=encoder, projector_hidden=projector_hidden,
                                                  features=features, readout=readout, num_graph_tokens=num_graph_tokens,
                                                  injection=injection, **kv))
        self.net.use_word_embedding(self.lm.get_input_embeddings())
        # the default contract until the data module's is adopted (setup) or a checkpoint's is read
        self.adopt_contract(AnswerContract(graph_mode=None))
        # the projector's output starts at the RMS of the LM's token embeddings, or of each layer's keys and values
        target = kv_scale(self.lm) if kv else \
            self.lm.get_input_embeddings().weight.detach().float().pow(2).mean().sqrt().item()
        self.net.projector.match_scale(target, torch.randn(64, encoder.hidden))
        if init_from:
            from qgmem.model.init_from import load_initial_weights

            load_initial_weights(self.net, init_from)
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            self.lm = get_peft_model(self.lm, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                         target_modules=list(lora.target_modules)))
        if gradient_checkpointing:
            if hasattr(self.lm, "activation_checkpointing_enable"):  # transformers >= 5.x naming
                self.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.strict_loading = False  # the frozen LM is not in the checkpoint; on_load_checkpoint checks the rest
        self.val_scores = AnswerScores()
        self.test_scores = AnswerScores()
        self.records = {"val": EvalRecords(), "test": EvalRecords()}
        self.test_predictions: list[dict[str, Any]] = []  # the last test's rows (TestPredictionsWriter)
        self._examples: list[dict[str, str]] = []
        self.data_info: dict[str, Any] = {}
        self.alignment_result: dict[str, Any] | None = None  # the pre-training phase's losses, once it ran
        self.alignment_seconds = 0.0
        self.keep_lm_frozen()

    # ----------------------------------------------------------------------------------------- modes
    def keep_lm_frozen(self) -> None:
        """Eval mode for the whole LM; with checkpointing, flag only the decoder layers as training.

        transformers recomputes a layer in backward only when that layer module is in training mode;
        setting the flag on the layer object alone (not its children) keeps dropout and every other
        mode-dependent behaviour of the LM in eval.
        """
        self.lm.eval()
        if self.hparams.gradient_checkpointing and self.training:
            for module in self.lm.modules():
                if getattr(module, "gradient_checkpointing", False):
                    module.training = True

    def train(self, mode: bool = True):
        super().train(mode)
        self.keep_lm_frozen()
        return self

    # ------------------------------------------------------------------------------------ forward
    def graph_tokens(self, graph: Batch) -> torch.Tensor | None:
        """``[B, K, lm_hidden]`` graph tokens (``None`` for ``graph_mode: none``)."""
        graph_mode = self.hparams.graph_mode
        if graph_mode == "none":
            return None
        if graph_mode == "shuffled":
            graph = self._shuffle(graph)
        return self.net(graph)

    def _shuffle(self, graph: Batch) -> Batch:
        """Each sample gets the next sample's graph (:func:`qgmem.model.graph_modes.shuffled`); a batch
        of one gets the empty graph."""
        graphs = graph.to_data_list()
        first = graphs[0]
        alone = empty_graph(first.num_node_features, first.edge_attr.size(1) if first.edge_attr is not None
                            else first.num_node_features, facts=getattr(first, "edge_fact", None) is not None)
        return Batch.from_data_list([g.to(first.x.device) for g in shuffled(graphs, alone)])

    def fused_inputs(self, batch: dict[str, Any], generation: bool = False):
        """Text embeddings with the graph token inserted: ``(embeds, mask, position_ids, labels, read)``, where
        ``read`` is the context the LM must run in to read a key/value prefix (nothing for ``input``)."""
        prefix = "gen_" if generation else ""
        ids = batch[f"{prefix}input_ids"]
        embeds = self.lm.get_input_embeddings()(ids)
        token = self.graph_tokens(batch["graph"])
        labels = None if generation else batch["labels"]
        pos = batch[f"{prefix}graph_pos"]
        return (*insert_token(embeds, batch[f"{prefix}attention_mask"], pos, token, labels),
                reading(self.lm, token, pos))

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Mean answer-token NLL of a batch."""
        embeds, mask, positions, labels, read = self.fused_inputs(batch)
        with read:
            return answer_nll(self.lm, embeds, mask, positions, labels, shared_prefix=self.shared_prefix(batch))

    def shared_prefix(self, batch: dict[str, Any]) -> int:
        """Columns every row shares before the graph slot (the template head), run once as a cache.

        Not with LoRA (the adapters change those states and must get their gradients), nor with
        gradient checkpointing (transformers turns the key/value cache off for recomputed layers).
        """
        if self.hparams.lora is not None or self.hparams.gradient_checkpointing:
            return 0
        return shared_prefix_length(batch["input_ids"], batch["attention_mask"], batch["graph_pos"])

    def answer_logits(self, batch: dict[str, Any]) -> tuple[torch.Tensor, AnswerLogits]:
        """The batch's answer NLL (as ``forward``) and the logits it came from, for a stage's term."""
        embeds, mask, positions, labels, read = self.fused_inputs(batch)
        with read:
            answer = AnswerLogits(*answer_logits(self.lm, embeds, mask, positions, labels, self.shared_prefix(batch)))
        return torch.nn.functional.cross_entropy(answer.logits, answer.targets), answer

    def sample_nll(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample mean answer NLL ``[B]`` and answer-token counts ``[B]`` (their weighted mean = ``forward``)."""
        embeds, mask, positions, labels, read = self.fused_inputs(batch)
        with read:
            per_row = answer_nll(self.lm, embeds, mask, positions, labels, reduction="none",
                                 shared_prefix=self.shared_prefix(batch))
        return per_row, (labels[:, 1:] != IGNORE_INDEX).sum(1)

    @torch.no_grad()
    def generate(self, batch: dict[str, Any]) -> list[str]:
        embeds, mask, _, _, read = self.fused_inputs(batch, generation=True)
        enc, settings = self.prompt_encoder, self.prompt_encoder.settings
        with read:
            out = generate(self.lm, self.tokenizer, mask, inputs_embeds=embeds,
                           max_new_tokens=self.generation.max_new_tokens, stop_ids=enc.stop_ids, pad_id=enc.pad_id,
                           stop_at_newline=settings.first_line and not settings.enable_thinking)
        return [final_answer(t, settings.first_line) for t in out.texts]

    # -------------------------------------------------------------------------------------- steps
    def _step(self, batch: dict[str, Any], stage: str, batch_idx: int = 0) -> torch.Tensor:
        B = batch["input_ids"].size(0)
        answer = None
        if stage == "train" and any(s.adds_term and s.reads_logits for s in self.stages):
            (loss, answer), per_row = self.answer_logits(batch), None
        elif stage == "train":
            loss, per_row = self(batch), None
        else:
            per_row, counts = self.sample_nll(batch)
            loss = (per_row * counts).sum() / counts.sum().clamp(min=1)
        on_step = stage == "train"
        # every logged mean is over all processes (a scalar all-reduce per step: nothing beside the LM's step)
        self.log(f"{stage}/nll", loss, batch_size=B, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=True)
        limit = {"val": self.generation.val_generate_batches,
                 "test": self.generation.test_generate_batches}.get(stage, 0)
        predictions = None
        if stage != "train" and (limit is None or batch_idx < limit):
            predictions = self.generate(batch)
            scores = self.val_scores if stage == "val" else self.test_scores
            scores.update(predictions, batch["answer"])
            if stage == "val" and len(self._examples) < self.generation.num_examples:
                for q, a, p in zip(batch["question"], batch["answer"], predictions):
                    self._examples.append({"question": q, "answer": a, "prediction": p})
        if per_row is not None:
            self.records[stage].add(batch, per_row, predictions)
        if stage == "train":
            loss = self._add_terms(batch, loss, answer)
        return loss

    def _add_terms(self, batch: dict[str, Any], loss: torch.Tensor, answer: AnswerLogits | None) -> torch.Tensor:
        """The answer loss plus each stage's weighted term, in list order; each term is logged as
        ``train/<term_name>``, and the sum as ``train/loss`` when a term was added."""
        B = batch["input_ids"].size(0)
        added = False
        for stage in self.stages:
            value = stage.term(self, batch, answer) if stage.adds_term else None
            if value is None:
                continue
            self.log(f"train/{stage.term_name}", value, batch_size=B, on_step=True, on_epoch=True, sync_dist=True)
            loss, added = loss + stage.weight * value, True
        if added:
            self.log("train/loss", loss, batch_size=B, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch, batch_idx):
        loss = self._step(batch, "train", batch_idx)
        # `graph_mode: none` without LoRA has nothing to train: the step only measures the text-only NLL
        return loss if loss.requires_grad else None

    def validation_step(self, batch, batch_idx):
        return self._step(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        return self._step(batch, "test", batch_idx)

    def _log_scores(self, stage: str) -> None:
        scores = self.val_scores if stage == "val" else self.test_scores
        if scores.total.item() == 0 and not torch.distributed.is_initialized():
            return
        for name, value in scores.compute().items():
            # already reduced across processes, so equal on every rank: the mean over ranks keeps the value
            self.log(f"{stage}/{name}", value, sync_dist=True)
        scores.reset()

    def _log_categories(self, stage: str) -> list[dict[str, Any]]:
        """``{stage}/{category}/{nll,em,f1}`` from every process's rows; returns the rows."""
        rows = self.records[stage].gather()
        self.records[stage].reset()
        for category, scores in by_category(rows).items():
            for name, value in scores.items():
                self.log(f"{stage}/{category}/{name}", value, sync_dist=True)  # gathered already: equal on every rank
        return rows

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")
        self._log_categories("val")
        experiment = getattr(self.logger, "experiment", None) if self.logger else None
        if self._examples and hasattr(experiment, "add_text") and self.trainer.is_global_zero:
            table = "\n".join(f"| {e['question']} | {e['answer']} | {e['prediction']} |".replace("\n", " ")
                              for e in self._examples)
            experiment.add_text("val/examples", "| question | reference | generation |\n|---|---|---|\n" + table,
                                self.global_step)
        self._examples = []

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")
        self.test_predictions = self._log_categories("test")

    # --------------------------------------------------------------------------------- optimizer
    def configure_optimizers(self):
        """``optimizer`` over the trainable parameters, ``lr_scheduler`` stepped every optimizer step."""
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        spec = hp.optimizer or DEFAULT_OPTIMIZER
        optimizer = _class_of(spec, torch.optim.Optimizer, "optimizer")(params, **dict(spec.get("init_args") or {}))
        spec = hp.lr_scheduler or DEFAULT_LR_SCHEDULER
        cls = _class_of(spec, torch.optim.lr_scheduler.LRScheduler, "lr_scheduler")
        init = dict(spec.get("init_args") or {})
        if "total_steps" in inspect.signature(cls).parameters and init.get("total_steps") is None:
            init["total_steps"] = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer else 1
        scheduler = cls(optimizer, **init)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------------------- checkpoints
    def configure_callbacks(self):
        """RNG states go into every checkpoint, so a resumed fit draws what the uninterrupted one would."""
        from qgmem.training.resume import RandomStates

        trainer = self._trainer
        if trainer is not None and any(isinstance(c, RandomStates) for c in trainer.callbacks):
            return []  # added by an earlier fit/validate/test of this trainer
        return [RandomStates()]

    def trainable_keys(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad} | {
            name for name, _ in self.named_buffers() if not name.startswith(CK.LM_PREFIX)}

    @_restricted_classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> QGMemModule:
        """Lightning's loader, without the ``init_from`` the run started from (unless it is passed).

        The checkpoint's weights replace those starting weights anyway, so a module re-created where that
        file does not exist (another machine, a cleaned run folder) still loads. An older checkpoint's
        flat stage and generation settings read as its ``stages`` and ``generation``, its ``graph`` as its
        ``graph_mode`` (:func:`qgmem.older_records.checkpoint_hparams`).
        """
        kwargs.setdefault("init_from", None)
        blocks = [b for b in MODULE_BLOCKS if b not in kwargs]
        if blocks:  # a checkpoint written before a block existed keeps its settings flat
            from lightning.fabric.utilities.cloud_io import _load as pl_load

            from qgmem.older_records import checkpoint_hparams

            checkpoint = pl_load(checkpoint_path, map_location="cpu", weights_only=kwargs.get("weights_only"))
            hparams = checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {}
            if hasattr(checkpoint_path, "seek"):  # a file object: Lightning reads it again
                checkpoint_path.seek(0)
            today = checkpoint_hparams(hparams)
            kwargs.update({b: today[b] for b in blocks if b not in hparams and b in today})
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def setup(self, stage: str) -> None:
        """Adopt the data module's answer contract (before fit, validate and test): the prompt the batches
        were built with, so this module's generations and its checkpoints use that one setting."""
        contract = self._datamodule_contract()
        if contract is not None:
            self.adopt_contract(contract)

    def _datamodule_contract(self) -> AnswerContract | None:
        """The answer contract of the trainer's data module (``None`` without a trainer or a data module)."""
        return getattr(getattr(self._trainer, "datamodule", None), "answer_contract", None)

    def on_fit_start(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        self.data_info = describe_datamodule(datamodule)
        for stage in self.stages:
            stage.fit_start(self, datamodule)

    def on_train_start(self) -> None:
        """Run the pre-training phase once, at the start of a fresh fit (never on resume, nor when
        :meth:`pretrain` already ran it)."""
        if not any(s.pretrains for s in self.stages) or self.global_step > 0 or self.alignment_result is not None:
            return
        import time

        started = time.perf_counter()
        loader = self.trainer.train_dataloader
        collate = getattr(loader.collate_fn, "graphs", loader.collate_fn)  # the stage reads the graphs only
        result = self.pretrain(loader.dataset, collate, seed=_order_seed(getattr(self.trainer, "datamodule", None)),
                               progress=self.trainer.is_global_zero)
        if self.trainer.world_size > 1:  # ranks aligned on their own draws: keep rank 0's weights everywhere
            state = self.trainer.strategy.broadcast({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, 0)
            self.net.load_state_dict(state)
            result = self.trainer.strategy.broadcast(result, 0)  # and rank 0's losses, logged by every rank
        self.alignment_result = result
        self.alignment_seconds = time.perf_counter() - started
        if result and self.trainer.is_global_zero and self.trainer.default_root_dir:
            from qgmem.model.init_from import ALIGNMENT_DIR, save_weights

            # a later run can start from here without the phase: --model.init_from <this file>, and the
            # pre-training stages' steps 0 (or the stages left out)
            result["weights"] = str(save_weights(self.net, os.path.join(self.trainer.default_root_dir,
                                                                          ALIGNMENT_DIR)))
        if result:
            self.log_dict({"align/first_loss": result["first_loss"], "align/last_loss": result["last_loss"]},
                          sync_dist=True)

    def pretrain(self, dataset, graphs, *, seed: int, progress: bool = False) -> dict[str, Any]:
        """The pre-training phase: each stage's, in list order, on ``net`` in place, over ``dataset``
        collated by ``graphs`` in the order of ``seed``; returns its losses (``{}`` without one).

        One pre-training stage: its ``first_loss``, ``last_loss`` and ``steps``. Several: the first
        stage's first loss, the last stage's last loss, the steps of all, and each stage's result under
        its class name (``stages``).
        """
        results = {type(s).__name__: s.pretrain(self, dataset, graphs, seed=seed, progress=progress)
                   for s in self.stages if s.pretrains}
        self.alignment_result = {}  # ran (a fit that follows skips it)
        runs = [r for r in results.values() if r]
        if len(runs) == 1:
            self.alignment_result = runs[0]
        elif runs:
            self.alignment_result = {"first_loss": runs[0]["first_loss"], "last_loss": runs[-1]["last_loss"],
                                     "steps": sum(r["steps"] for r in runs), "stages": results}
        return self.alignment_result

    def adopt_contract(self, contract: AnswerContract) -> None:
        """Take ``contract`` as the run's (:attr:`contract`), as a trainer's ``setup`` does with its data
        module's; for a module used without a trainer (a study, a benchmark, a stage's test). Its prompt
        holds this network's ``num_graph_tokens`` slots, and a contract without a graph mode gets the mode
        this module trains with."""
        prompt = replace(contract.prompt, num_graph_tokens=self.net.config.num_graph_tokens)
        mode = contract.graph_mode or self.hparams.get("graph_mode", self.hparams.get("graph"))
        self.contract = replace(contract, prompt=prompt, graph_mode=mode)
        self.prompt_encoder = PromptEncoder(self.tokenizer, prompt)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only trainable weights (+ non-LM buffers): the frozen LM is reloaded from its id."""
        keep = self.trainable_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}
        checkpoint[CK.DATA_INFO] = self.data_info
        checkpoint[CK.ANSWER_CONTRACT] = self.contract.to_dict()
        checkpoint[CK.GRAPH_TOKEN] = self.net.config.to_dict()
        checkpoint[CK.PROVENANCE] = provenance()  # the code that trained it, for the export
        checkpoint[CK.LM] = {"dtype": str(self.lm.dtype).replace("torch.", ""),
                                  "hidden_size": self.net.config.lm_hidden, "end_of_turn_id": self.prompt_encoder.eot_id}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        missing = sorted(k for k in self.trainable_keys() if k not in checkpoint["state_dict"])
        if missing:
            raise KeyError(f"checkpoint lacks trainable weights {missing[:5]}{' ...' if len(missing) > 5 else ''}: "
                           "it was saved by a model with another encoder shape, LM or LoRA setting")
        self.data_info = dict(checkpoint.get(CK.DATA_INFO) or {})
        if self._datamodule_contract() is not None:  # a run's data module made its contract (setup adopted it)
            return
        block = checkpoint.get(CK.ANSWER_CONTRACT)
        if block is None:  # written before the block: its parts are where the module kept them then
            from qgmem.older_records import checkpoint_contract

            block = checkpoint_contract(checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY) or {}, self.data_info)
        self.adopt_contract(AnswerContract.from_dict(block))


def _check_injection(injection: str, stages: list[Stage], checkpointing: bool) -> None:
    """A key/value prefix is not an input embedding: the word alignment cannot fit it, and a recomputed
    layer would run without the prefix's hooks."""
    if injection not in INJECTIONS:
        raise SettingError(f"model.injection must be one of {INJECTIONS}, got {injection!r}")
    if injection != "kv_prefix":
        return
    if any(isinstance(s, NodeWordAlignment) for s in stages):
        raise SettingError("model.injection = 'kv_prefix' writes keys and values, which the NodeWordAlignment "
                           "stage (it fits input embeddings to words) cannot train: list MemoryReconstruction "
                           "in model.stages instead, or no pre-training stage")
    if checkpointing:
        raise SettingError("model.injection = 'kv_prefix' does not run with model.gradient_checkpointing: a "
                           "recomputed layer would be recomputed without the prefix")


def _class_of(spec: dict[str, Any], base: type, what: str) -> type:
    """The class a ``{class_path, init_args}`` names (``AdamW`` alone means ``torch.optim.AdamW``)."""
    path = spec.get("class_path") if isinstance(spec, dict) else None
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} must be {{class_path: ..., init_args: {{...}}}}, got {spec!r}")
    module, _, attr = path.rpartition(".")
    try:  # a bare name is looked up in torch.optim (and its lr_scheduler), as jsonargparse does
        homes = [importlib.import_module(module)] if module else [torch.optim, torch.optim.lr_scheduler]
    except ImportError:
        homes = []
    found = next((getattr(m, attr) for m in homes if hasattr(m, attr)), None)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ValueError(f"{what} {path!r} is not a {base.__module__}.{base.__name__} class")
    return found


def describe_datamodule(datamodule) -> dict[str, Any]:
    """The data-side facts an export must carry (sentence encoder, activation parameters, cache key)."""
    if datamodule is None:
        return {}
    info: dict[str, Any] = {}
    for name in ("dataset", "sentence_encoder", "feature_dim", "cache_key", "lm", "max_prompt_tokens",
                 "max_answer_tokens", "answer_filter", "construction", "construction_llm", "activation", "summary"):
        try:
            value = getattr(datamodule, name, None)
        except Exception:  # e.g. a summary that is not built yet: the export just lacks it
            value = None
        if value is None:
            value = getattr(getattr(datamodule, "hparams", {}), "get", lambda _k: None)(name)
        if value is not None:
            info[name] = _plain(value)
    return info


def _order_seed(datamodule: Any) -> int:
    """The data side's order seed (the alignment stage draws in that order too); 0 without a data module."""
    if datamodule is None:
        return 0
    seed = getattr(datamodule, "order_seed", None)
    return int(seed if seed is not None else (getattr(datamodule, "seed", 0) or 0))
