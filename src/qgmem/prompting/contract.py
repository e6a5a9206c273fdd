"""The answer prompt's wording and settings: one contract for the answer filter, training, eval and serving.

The frozen LM must read the same prompt when the training data is filtered, when the graph token is
trained and evaluated, and when an export is served; :class:`PromptSettings` is set once (on the data
side of a training run), saved in checkpoints and written into every export's ``config.json``, and
:mod:`qgmem.serving` rebuilds the prompt from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from qgmem.older_records import read_prompt
from qgmem.prompting.entries import ENTRY

SYSTEM_PROMPT = (
    "You answer questions about a user's long conversation history using only the memory entries "
    "given. Entries are labelled [M1], [M2], ...; when entries conflict, the latest state of a "
    "trajectory wins. If the memory does not contain the answer, say you don't know. Answer in one "
    "short sentence."
)
NO_MEMORY_TEXT = "(no memory entries)"
# The graph-only prompt has no "[M1]" entries to refer to; a short system turn also keeps it cheap.
GRAPH_ONLY_SYSTEM_PROMPT = ("You answer questions about a user's conversation history from the memory given. "
                            "Answer in one short sentence.")


@dataclass
class PromptSettings:
    """How a (memory, question) pair becomes the LM's prompt and how its answer is read back.

    Args:
        max_prompt_tokens: prompt length cap in text tokens (graph tokens not counted); the memory text
            is trimmed from its end to fit, never the question.
        max_answer_tokens: supervised answer length, end-of-turn token included.
        enable_thinking: the chat template's thinking switch (Qwen3); off for answers in one sentence.
        system_prompt: the system turn (``None``: no system turn).
        num_graph_tokens: ``K``, the graph-token slots placed together right before the user content
            (``None``: not fixed here; the model sets it to its readout's K, whose default is the module's).
        include_memory_text: ``False`` is the graph-only prompt: the textual working memory is left out
            and the graph tokens are the only memory the LM sees.
        first_line: an answer is its first non-empty line (generation stops at a line break when thinking
            is off): the prompt asks for one short sentence and a small LM that goes on only costs time.
        memory_units: the textual working memory keeps only its first ``m`` entries (``[M1]`` ..
            ``[Mm]``, the top of the reranked order) while the graph tokens still cover all ``k`` units;
            ``None`` keeps every entry. The context-budget setting: ``0`` leaves no entry in the text.
    """

    max_prompt_tokens: int = 1024
    max_answer_tokens: int = 64
    enable_thinking: bool = False
    system_prompt: str | None = SYSTEM_PROMPT
    num_graph_tokens: int | None = None
    include_memory_text: bool = True
    first_line: bool = True
    memory_units: int | None = None

    def __post_init__(self) -> None:
        check_budgets(self.memory_units, None, text_name="prompt.memory_units", graph_name="activation.k")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be >= 1, got {self.max_answer_tokens}")
        if self.num_graph_tokens is not None and self.num_graph_tokens < 1:
            raise ValueError(f"num_graph_tokens must be >= 1, got {self.num_graph_tokens}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> PromptSettings:
        """Settings from a saved dict (older names read as today's: :mod:`qgmem.older_records`); unknown
        keys are refused by name, missing ones take defaults."""
        data = read_prompt(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown prompt setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: v for k, v in data.items() if v is not None or k == "system_prompt"})


def memory_entries(memory_text: str) -> list[tuple[int, str]]:
    """The labelled entries of a textual working memory, in order: ``(i, text)`` for each ``[Mi] text``
    (the text without its label, up to the next entry); text ahead of the first entry is not an entry."""
    found = list(ENTRY.finditer(memory_text))
    ends = [match.start() for match in found[1:]] + [len(memory_text)]
    return [(int(match.group(1)), memory_text[match.end():end].strip()) for match, end in zip(found, ends)]


def first_entries(memory_text: str, m: int | None) -> str:
    """The textual working memory cut to its entries ``[M1]`` .. ``[Mm]`` (``None``: all of it).

    Entries are the lines :func:`qgmem.activation.serialize.serialize_working_memory` writes in reranked order, so the first ``m``
    are the top ``m`` units; text ahead of the first entry (none is written) is kept.
    """
    if m is None:
        return memory_text
    starts = [(int(match.group(1)), match.start()) for match in ENTRY.finditer(memory_text)]
    cut = next((pos for label, pos in starts if label > m), None)
    return memory_text if cut is None else memory_text[:cut].rstrip("\n")


def check_budgets(text_units: int | None, graph_units: int | None, *, text_name: str = "data.memory_units",
                  graph_name: str = "data.activation.k") -> None:
    """Refuse text and graph budgets that cannot hold together, naming the setting.

    The graph is built over the top ``graph_units`` units (the working memory, ``activation.k``); the
    prompt's text holds the top ``text_units`` of them (``memory_units``; ``None``: all). A text budget
    above the graph's would claim units the working memory never holds.
    """
    from qgmem.errors import SettingError

    if graph_units is not None and graph_units < 1:
        raise SettingError(f"{graph_name} must be >= 1 (units the graph is built over), got {graph_units}")
    if text_units is None:
        return
    if text_units < 0:
        raise SettingError(f"{text_name} must be >= 0 (or null: every unit of {graph_name}), got {text_units}")
    if graph_units is not None and text_units > graph_units:
        raise SettingError(f"{text_name} = {text_units} is more than {graph_name} = {graph_units}: the prompt's "
                           "text holds the top units of the graph's, at most all of them")


def user_content(memory_text: str, question: str, include_memory: bool = True) -> str:
    """The user turn: the textual working memory (unless left out), then the question."""
    if not include_memory:
        return f"Question: {question.strip()}"
    memory = memory_text.strip() or NO_MEMORY_TEXT
    return f"Memory:\n{memory}\n\nQuestion: {question.strip()}"


def memory_with_graph_text(memory_text: str, graph_text: str) -> str:
    """The memory block for a backbone that cannot read a graph token: entries, then the graph as triples."""
    memory, graph = memory_text.strip(), graph_text.strip()
    if not graph:
        return memory
    return f"{memory}\n\nLocal memory graph (subject; relation; object) [entry]:\n{graph}" if memory else graph


def build_messages(memory_text: str, question: str, system_prompt: str | None = SYSTEM_PROMPT,
                   include_memory: bool = True) -> list[dict[str, str]]:
    """Chat messages for the frozen LM (system turn omitted when ``system_prompt`` is ``None``)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user_content(memory_text, question, include_memory)})
    return messages
