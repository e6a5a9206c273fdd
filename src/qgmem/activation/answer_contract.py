"""What an answer depends on, as one object: the prompt and its budgets, the activation and the graph mode.

It lives in the lowest layer holding all of its parts (the prompt contract on the ground floor, the graph
modes in ``model``, the activation here), so the data side that makes it, the checkpoint and the export
that record it and the serving side that reads it share one class, one record and one validation. Where
the graph enters the LM is the network's (``GraphTokenConfig.injection``), not the contract's.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Any

from qgmem.activation.config import ActivationConfig
from qgmem.errors import SettingError
from qgmem.model.graph_modes import GraphMode, check_mode
from qgmem.prompting.contract import PromptSettings, check_budgets

#: the block's fields, in the order a checkpoint and an export record them
FIELDS = ("prompt", "activation", "graph_mode")


@dataclass
class AnswerContract:
    """The prompt (its text budget ``memory_units`` and caps), the activation that fills it and the graph
    mode an answer reads by default; checked together once, when it is made.

    Args:
        prompt: the prompt contract (:class:`~qgmem.prompting.PromptSettings`).
        activation: the query-time activation (``k``: the units the graph is built over).
        graph_mode: ``token`` (the graph tokens), ``none`` (the text prompt alone) or ``shuffled``;
            ``None`` only where a training run's data module makes it: the mode the model trains with,
            which the training module fills in when it adopts the contract.
        names: how the text and graph budgets are called where the contract is made (a training run's
            ``data.memory_units`` and ``data.activation.k``; a record's fields by default), so a refusal
            names what the user set.
    """

    prompt: PromptSettings = field(default_factory=PromptSettings)
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    graph_mode: GraphMode | None = "token"
    names: InitVar[tuple[str, str]] = ("prompt.memory_units", "activation.k")

    def __post_init__(self, names: tuple[str, str]) -> None:
        # the text budget m is the top m of the graph's k units: m <= k, checked here and nowhere else
        check_budgets(self.prompt.memory_units, self.activation.k, text_name=names[0], graph_name=names[1])
        if self.graph_mode is not None:
            try:
                check_mode(self.graph_mode)
            except ValueError as exc:
                raise SettingError(f"field 'graph_mode': {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The contract as one record (a checkpoint's block, an export's ``answer`` block)."""
        return {"prompt": self.prompt.to_dict(), "activation": self.activation.to_dict(), "graph_mode": self.graph_mode}

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None, where: str = "") -> AnswerContract:
        """The contract a record holds (a part it lacks: the default); ``where`` prefixes the field names of a
        refusal (``answer.`` in an export), which is a :class:`SettingError` naming the field."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise SettingError(f"field '{where}{unknown[0]}' is not part of the answer contract "
                               f"(its fields: {', '.join(FIELDS)})")

        def block(kind, name):
            found = values.get(name)
            try:
                return kind.from_dict(found) if found else kind()
            except (TypeError, ValueError) as exc:
                raise SettingError(f"field '{where}{name}' cannot be read by this qgmem: {exc}") from exc

        return cls(prompt=block(PromptSettings, "prompt"), activation=block(ActivationConfig, "activation"),
                   graph_mode=values.get("graph_mode") or "token",
                   names=(f"{where}prompt.memory_units", f"{where}activation.k"))

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> AnswerContract:
        """The contract an export's ``config.json`` records (its ``answer`` block, as today's format writes
        it: :func:`qgmem.older_records.read_export_config` reads older ones so)."""
        return cls.from_dict(config.get("answer"), where="answer.")
