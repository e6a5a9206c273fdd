"""The answer prompt shared by answer filtering, training, evaluation and serving.

One place so the frozen LM sees the same wording when the training data is filtered, when the graph
token is trained, and when the exported encoder is served.
"""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You answer questions about a user's long conversation history using only the memory entries "
    "given. Entries are labelled [M1], [M2], ...; when entries conflict, the latest state of a "
    "trajectory wins. If the memory does not contain the answer, say you don't know. Answer in one "
    "short sentence."
)

# Graph-only prompts have no "[M1]" entries to refer to; a short system prompt also keeps them cheap.
GRAPH_ONLY_SYSTEM_PROMPT = ("You answer questions about a user's conversation history from the memory given. "
                            "Answer in one short sentence.")


def user_content(memory_text: str, question: str, with_memory_text: bool = True) -> str:
    """The user turn: the textual working memory, then the question.

    ``with_memory_text=False`` is the graph-only setting: the question alone, so the graph token is the
    only evidence the LM gets.
    """
    if not with_memory_text:
        return f"Question: {question.strip()}"
    memory = memory_text.strip() or "(no memory entries)"
    return f"Memory:\n{memory}\n\nQuestion: {question.strip()}"


def build_messages(memory_text: str, question: str, system_prompt: str | None = SYSTEM_PROMPT,
                   with_memory_text: bool = True) -> list[dict[str, str]]:
    """Chat messages for the frozen LM (system prompt omitted when ``None``)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user_content(memory_text, question, with_memory_text)})
    return messages
