"""Each route's body and reply as a pydantic model: one declaration gives the check, the docs and the
``/openapi.json`` schema (the request models beside the routers, as vLLM keeps ``protocol.py`` beside
``api_router.py``).

A body is read and parsed by :mod:`qgmem.serving.requests` (bytes, time, shape, depth, Unicode), then
validated here with :func:`validate`: strict types (``"stream": "no"`` is not ``false``), unknown fields
refused, and a failure is one :class:`~qgmem.serving.requests.ApiError` naming the field
(``sessions[1]: turns[0]: field 'text' …``); a length past a server limit (:class:`Limits`, passed as
the validation context) is a 413 naming the limit. The reply models document what the routes return;
the Python client (:mod:`qgmem.client`) reads its results with them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from qgmem.model.graph_modes import GRAPH_MODES
from qgmem.older_records import REQUEST_RENAMED
from qgmem.serving.requests import (EXPORT_FORMAT, EXPORT_VERSION, MAX_BATCH_SESSIONS, UNIT_ID, ApiError, Limits,
                                    check_filters)
from qgmem.timeexpr import parse_time


# ------------------------------------------------------------------------------------------ checks
def _limit(name: str):
    """A length checked against ``Limits.<name>`` of the validation context (past it: 413)."""

    def check(value, info: ValidationInfo):
        limit = getattr((info.context or {}).get("limits") or Limits(), name)
        if len(value) > limit:
            unit = "characters" if isinstance(value, str) else "items"
            raise PydanticCustomError("over_limit", "is {n} {unit}, over the limit of {limit}",
                                      {"n": len(value), "unit": unit, "limit": limit})
        return value

    return AfterValidator(check)


def _nonblank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "must be a non-empty string")
    return value


def _time(value: str) -> str:
    if len(value) > 64 or parse_time(value) is None:
        raise PydanticCustomError("time", "must be an ISO-8601 date or date-time (e.g. 2024-05-01, "
                                  "2024-05-01T10:00:00 or 2024-05-01T10:00:00+05:00), got {got}",
                                  {"got": repr(value[:64])})
    return value


def _unit_id(value: str) -> str:
    if not UNIT_ID.fullmatch(value):
        raise PydanticCustomError("unit_id", "must match {pattern} (a unit id as memories and search show it), "
                                  "got {got}", {"pattern": UNIT_ID.pattern, "got": json.dumps(value)[:40]})
    return value


#: ranked units a search lists at most
MAX_SEARCH_UNITS = 1000

Time = Annotated[str, AfterValidator(_time)]
UnitId = Annotated[str, AfterValidator(_unit_id)]
Question = Annotated[str, AfterValidator(_nonblank), _limit("max_question_chars")]


def renamed(name: str) -> AliasChoices:
    """A request field read by its name and by the names it had before (:data:`REQUEST_RENAMED`), so a
    client written then keeps working; the schema shows the name."""
    return AliasChoices(name, *sorted(old for old, new in REQUEST_RENAMED.items() if new == name))


class Body(BaseModel):
    """A request body: strict types, no unknown field."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Reply(BaseModel):
    """A reply: the fields documented here, and any the server adds later kept."""

    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------ request bodies
class Turn(Body):
    speaker: Annotated[str, AfterValidator(_nonblank), _limit("max_speaker_chars")]
    text: Annotated[str, AfterValidator(_nonblank), _limit("max_turn_chars")]
    time: Time | None = None


class Session(Body):
    """``POST /v1/users/{id}/sessions``: one session of turns."""

    turns: Annotated[list[Turn], Field(min_length=1), _limit("max_turns")]
    time: Time | None = None

    def plain(self) -> tuple[list[dict[str, Any]], str | None]:
        """The turns in journal form (no ``time`` key when a turn has none) and the session's time."""
        return [t.model_dump(exclude_none=True) for t in self.turns], self.time


class Batch(Body):
    """``POST /v1/users/{id}/sessions/batch``."""

    sessions: Annotated[list[Session], Field(min_length=1, max_length=MAX_BATCH_SESSIONS)]


class AnswerRequest(Body):
    """``POST /v1/users/{id}/answer``."""

    question: Question
    time: Time | None = None
    #: None: the export's default graph mode
    graph_mode: Literal[GRAPH_MODES] | None = Field(None, validation_alias=renamed("graph_mode"))
    max_tokens: Annotated[int, Field(ge=1)] | None = None


class SearchRequest(Body):
    """``POST /v1/users/{id}/search``: the question, how many ranked units to list, and the filters."""

    question: Question
    time: Time | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_SEARCH_UNITS)] | None = None
    after: Time | None = None
    before: Time | None = None
    time_field: Literal["utterance", "fact"] = "utterance"
    sessions: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]],
                        Field(min_length=1, max_length=10_000)] | None = None

    def filters(self):
        return check_filters(self.model_dump(include={"after", "before", "time_field", "sessions"},
                                             exclude_none=True))


class Forget(Body):
    forget: UnitId


class ExportDocument(Body):
    """``POST /v1/users/{id}/import`` (what ``GET /v1/users/{id}/export`` returns); its entries are
    checked one at a time (:func:`import_entries`), each a :class:`Session` or a :class:`Forget`."""

    format: Literal[EXPORT_FORMAT]
    version: Annotated[int, Field(ge=EXPORT_VERSION, le=EXPORT_VERSION)]  # strict: not true, not 1.0
    user: str | None = None
    entries: list[Session | Forget]


class ChatMessage(BaseModel):
    """One OpenAI message: its ``role``; a user message's ``content`` is the question (other fields of
    OpenAI's messages, ``name`` and the like, are kept and not read)."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: Any = None


class ChatRequest(Body):
    """``POST /v1/chat/completions``: OpenAI's body. ``user`` names the memory, the last user message is
    the question; the fields this server honours or may ignore without changing the answer are declared
    (sampling settings: answers are greedy, the export's contract; caching, storage and routing hints),
    and those asking for what the model cannot do (:data:`CHAT_UNSUPPORTED`) are refused by name unless
    given their neutral value, as OpenAI refuses them for a model without the feature."""

    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    user: Annotated[str, Field(min_length=1)]
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: float | None = None
    top_p: Any = None
    seed: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    metadata: dict[str, Any] | None = None
    store: Any = None
    service_tier: Any = None
    parallel_tool_calls: Any = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    #: qgmem's own: the answer's graph mode
    graph_mode: Literal[GRAPH_MODES] | None = Field(None, validation_alias=renamed("graph_mode"))
    time: Time | None = None  # qgmem's own: the question's time
    # refused unless neutral (checked before the types, so the refusal names them)
    n: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    stop: Any = None
    logit_bias: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    verbosity: Any = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, body: Any) -> Any:
        if isinstance(body, dict):
            for key, neutral in CHAT_UNSUPPORTED.items():
                if key in body and body[key] not in neutral:
                    raise PydanticCustomError("unsupported", "field '{field}' is not supported by this server (it "
                                              "answers one greedy text reply from the user's memory); leave it out",
                                              {"field": key})
        return body

    def question(self, limits: Limits) -> str:
        """The last user message's text (a string, or the text parts of a list)."""
        question = None
        for i, message in enumerate(self.messages):
            if message.role == "user":
                question = _content_text(message.content, i)
        if question is None or not question.strip():
            raise ApiError(400, "field 'messages' holds no user message with text: the last one is the question")
        if len(question) > limits.max_question_chars:
            raise ApiError(413, f"the question is {len(question)} characters, over the limit of "
                                f"{limits.max_question_chars}")
        return question

    def token_cap(self, server_max_tokens: int) -> int:
        """``max_completion_tokens`` (or the older ``max_tokens``), at most the server's cap."""
        asked = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return server_max_tokens if asked is None else min(asked, server_max_tokens)


#: OpenAI fields asking for what this model cannot do, and the neutral values that are accepted
CHAT_UNSUPPORTED = {"n": (None, 1), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
                    "function_call": (None, "none"), "response_format": (None, {"type": "text"}),
                    "logprobs": (None, False), "top_logprobs": (None, 0), "stop": (None, [], ""),
                    "logit_bias": (None, {}), "audio": (None,), "modalities": (None, ["text"]),
                    "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
                    "verbosity": (None, "medium")}


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if all(isinstance(part, str) for part in parts):
            return "\n".join(parts)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts")


# ------------------------------------------------------------------------------------------- replies
class _Stored(Reply):
    """What every append reply says of the user's memory after it (and whether a key replayed it)."""

    user: str
    units: int
    traces: int
    seconds: dict[str, float] = {}
    replayed: bool = False


class Appended(_Stored):
    session: int
    units_added: int


class BatchSession(Reply):
    session: int
    units_added: int


class BatchAppended(_Stored):
    sessions: list[BatchSession]


class TraceState(Reply):
    trace_id: str
    subject: str | None = None
    relation: str | None = None
    transition: str | None = None
    position: int
    length: int
    current: bool


class Unit(Reply):
    unit_id: str
    fact: str
    speaker: str | None = None
    fact_time: str | None = None
    utterance_time: str | None = None
    session_id: str | None = None
    source_turn_ids: list[str] = []
    trace: TraceState | None = None


class RankedUnit(Unit):
    label: str
    score: float


class Graph(Reply):
    nodes: list[str] = []
    edges: list[dict[str, Any]] = []


class SearchResult(Reply):
    user: str
    question: str
    time: str | None = None
    store_units: int
    matching_units: int | None = None
    units: list[RankedUnit]
    graph: Graph
    graph_text: str
    memory_text: str
    seconds: dict[str, float]


class MemoryEntry(Reply):
    label: str
    unit_id: str
    fact: str
    score: float


class AnswerResult(Reply):
    user: str
    question: str
    answer: str
    graph_mode: str
    finish_reason: str
    cited: list[str]
    memory: list[MemoryEntry]
    graph: Graph
    seconds: dict[str, float]
    tokens: dict[str, int]
    batch_size: int


class Memories(Reply):
    user: str
    total: int
    offset: int
    limit: int
    units: list[Unit]
    sessions: int


class Forgotten(Reply):
    user: str
    unit_id: str
    forgotten: bool
    units: int
    traces: int


class Imported(Reply):
    user: str
    imported: bool
    lines: int
    units: int
    traces: int
    sessions: int


class Deleted(Reply):
    user: str
    deleted: bool


class Health(Reply):
    status: str
    users_loaded: int
    queue: int


class ErrorDetail(Reply):
    message: str
    type: str
    code: int


class ErrorBody(Reply):
    """Every error: ``{"error": {"message", "type", "code"}}``."""

    error: ErrorDetail


# -------------------------------------------------------------------------------------- validation
def validate(model: type[Body], body: Any, limits: Limits, where: str = ""):
    """``body`` as ``model``, or one :class:`ApiError` naming the first field at fault."""
    try:
        return model.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        raise _api_error(exc, where) from None


def import_entries(document: Any, limits: Limits) -> list[dict[str, Any]]:
    """An export document checked (its head as :class:`ExportDocument`, then each entry on its own, so a
    huge import is checked in pieces and the first bad entry is named): the entries in journal form."""
    if not isinstance(document, dict):
        raise ApiError(400, "the body must be a JSON object with fields 'format', 'version' and 'entries' "
                            "(what GET /v1/users/{id}/export returns)")
    validate(ExportDocument, {**document, "entries": []}, limits)
    if not isinstance(document.get("entries"), list):
        raise ApiError(400, "field 'entries' must be a list of sessions {\"turns\", \"time\"} and forgets "
                            "{\"forget\"}")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(document["entries"]):
        if isinstance(entry, dict) and "forget" in entry:
            out.append({"forget": validate(Forget, entry, limits, f"entries[{i}]: ").forget})
        else:
            turns, when = validate(Session, entry, limits, f"entries[{i}]: ").plain()
            out.append({"turns": turns, "time": when})
    return out


def _api_error(exc: ValidationError, where: str) -> ApiError:
    """The first error of ``exc`` as the service words it: ``turns[0]: field 'text' must be …``."""
    error = exc.errors(include_url=False)[0]
    prefix, field = where, ""  # ("sessions", 1, "turns", 0, "text") -> "sessions[1]: turns[0]: " and "text"
    for part in error["loc"]:
        if isinstance(part, int):
            field += f"[{part}]"
        elif field.endswith("]"):
            prefix, field = f"{prefix}{field}: ", part
        else:
            field = f"{field}.{part}" if field else part
    kind, message = error["type"], error["msg"]
    if kind == "unsupported":
        return ApiError(400, message)
    if kind == "extra_forbidden":
        return ApiError(400, f"{prefix}unknown field '{field}'")
    if kind in ("over_limit", "too_long"):  # a count or a length past a limit: 413
        got = error.get("input")
        count = len(got) if isinstance(got, (list, str)) else ""
        limit = (error.get("ctx") or {}).get("limit", (error.get("ctx") or {}).get("max_length"))
        what = f"holds {count} {field}" if isinstance(got, list) else f"is {count} characters"
        return ApiError(413, f"{prefix}field '{field}' {what}, over the limit of {limit}")
    if kind == "missing":
        message = "is required"
    elif field in ("format", "version") and not prefix:
        return ApiError(400, f"fields 'format' and 'version' must be {EXPORT_FORMAT!r} and {EXPORT_VERSION} (an "
                             f"export of this server), got {json.dumps(error.get('input'))[:40]}")
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = "must be a JSON object"
    elif kind == "too_short":
        message = "must not be empty"
    got = error.get("input")
    shown = "" if kind in ("missing", "over_limit") or kind.startswith(("blank", "time", "unit_id")) else \
        f", got {json.dumps(got)[:40] if _jsonable(got) else type(got).__name__}"
    subject = f"{prefix}field {field!r}" if field else prefix.rstrip(": ") or "the body"  # an entry: its place
    return ApiError(400, f"{subject} {_lower(message)}{shown}")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _lower(message: str) -> str:
    """Pydantic's ``Input should be …`` as ``must be …`` (the service's wording)."""
    for start, instead in (("Input should be", "must be"), ("List should have", "must have"),
                           ("Value error, ", "")):
        if message.startswith(start):
            return instead + message[len(start):]
    return message


# ------------------------------------------------------------------------------------------- schema
class ChatCompletion(Reply):
    """``POST /v1/chat/completions`` (not streamed): OpenAI's reply, qgmem's extras under ``qgmem``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, int]
    qgmem: dict[str, Any]


class ModelCard(Reply):
    id: str
    object: str
    created: int
    owned_by: str


class ModelList(Reply):
    object: str
    data: list[ModelCard]


def route(reply: type[Reply] | None = None, body: type[Body] | None = None) -> dict[str, Any]:
    """A route decorator's schema arguments: its reply model (200) and the error body, and its request
    body model (the route reads and checks the body itself, bounded; the schema names the model)."""
    out: dict[str, Any] = {"responses": {400: {"model": ErrorBody}, 413: {"model": ErrorBody}}}
    if reply is not None:  # documented, not re-validated: the reply is built by the service as it is
        out["responses"][200] = {"model": reply, "description": reply.__doc__ or reply.__name__}
    if body is not None:
        out["openapi_extra"] = {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}}
    return out


REQUEST_MODELS: tuple[type[Body], ...] = (Session, Batch, AnswerRequest, SearchRequest, ExportDocument, ChatRequest)


def request_schemas() -> dict[str, Any]:
    """The request models' JSON schemas, for ``components.schemas`` of ``/openapi.json``."""
    from pydantic.json_schema import models_json_schema

    _, schema = models_json_schema([(m, "validation") for m in REQUEST_MODELS],
                                   ref_template="#/components/schemas/{model}")
    return schema["$defs"]
