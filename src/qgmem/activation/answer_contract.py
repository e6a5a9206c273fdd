"""What an answer depends on, as one object: the prompt and its budgets, the activation, the graph mode
and where the graph enters the LM.

It lives in the lowest layer holding all of its parts (the prompt contract on the ground floor, the graph
modes and injections in ``model``, the activation here), so the data side that makes it and the serving
side that reads it share one class and one validation.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Any

from qgmem.activation.config import ActivationConfig
from qgmem.errors import SettingError
from qgmem.model.graph_modes import GraphMode, check_mode
from qgmem.model.kv_prefix import INJECTIONS, Injection
from qgmem.prompting.contract import PromptSettings, check_budgets


@dataclass
class AnswerContract:
    """The prompt (its text budget ``memory_units`` and caps), the activation that fills it, the graph mode
    an answer reads by default and the graph's injection; checked together once, when it is made.

    Args:
        prompt: the prompt contract (:class:`~qgmem.prompting.PromptSettings`).
        activation: the query-time activation (``k``: the units the graph is built over).
        graph_mode: ``token`` (the graph tokens), ``none`` (the text prompt alone) or ``shuffled``.
        injection: ``input`` (graph tokens among the input embeddings) or ``kv_prefix``.
        names: how the text and graph budgets are called where the contract is made (a training run's
            ``data.memory_units`` and ``data.activation.k``; an export's fields by default), so a refusal
            names what the user set.
    """

    prompt: PromptSettings = field(default_factory=PromptSettings)
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    graph_mode: GraphMode = "token"
    injection: Injection = "input"
    names: InitVar[tuple[str, str]] = ("prompt.memory_units", "activation.k")

    def __post_init__(self, names: tuple[str, str]) -> None:
        # the text budget m is the top m of the graph's k units: m <= k, checked here and nowhere else
        check_budgets(self.prompt.memory_units, self.activation.k, text_name=names[0], graph_name=names[1])
        try:
            check_mode(self.graph_mode)
        except ValueError as exc:
            raise SettingError(f"field 'graph_mode': {exc}") from exc
        if self.injection not in INJECTIONS:
            raise SettingError(f"injection must be one of {', '.join(INJECTIONS)}, got {self.injection!r}")

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> AnswerContract:
        """The contract an export's ``config.json`` records (its prompt, activation, graph mode and network
        blocks); a field that does not read is a :class:`SettingError` naming it."""
        def block(kind, name):
            values = config.get(name)
            try:
                return kind.from_dict(values) if values else kind()
            except (TypeError, ValueError) as exc:
                raise SettingError(f"field '{name}' cannot be read by this qgmem: {exc}") from exc

        return cls(prompt=block(PromptSettings, "prompt"), activation=block(ActivationConfig, "activation"),
                   graph_mode=config.get("graph_mode") or "token",
                   injection=(config.get("graph_token") or {}).get("injection") or "input")
