"""Turning an HTTP request into validated engine inputs: body, identity headers, deadline, tokens."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import Scope

from admission.deadline import DeadlineError, parse_deadline
from billing.fields import REQUEST_ID_MAX, TASK_ID_MAX, WORKFLOW_RUN_ID_MAX
from engine import EngineClient, InvalidRequestError, SamplingParams
from engine.core.limits import RequestCaps
from gateway.edge.auth import bearer_token
from gateway.edge.errors import APIError
from gateway.openai import tools
from gateway.openai.body_depth import too_deep
from gateway.openai.body_shape import SHAPE_SCAN_BYTES, BodyCount, count_body
from gateway.openai.preprocess import Timed
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, first_error, unserved_part
from gateway.openai.structured import response_grammar
from gateway.settings import MAX_JSON_DEPTH

# X-Task-Id and X-Workflow-Run-Id are stored in the ledger's columns of those names: capped at their width
# (TASK_ID_MAX, WORKFLOW_RUN_ID_MAX). Each must be readable back through its route (GET /v1/tasks/{id},
# /v1/workflow-runs/{id}, POST /v1/tasks/{id}/cancel): no "/" (a path separator, which the routes never
# match), and not "." or ".." (a client normalises those path segments away).
_TOKEN_ID = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._:\-]+$")
# Prompts (text, or what a chat template will render) longer than this are tokenised on the tokenising
# executor, not on the event loop: the byte-level tokenizer costs about a microsecond per byte here, so a
# 256 KiB prompt would hold every other request's I/O for a quarter of a second. Below it the thread hop
# costs more than the work. (docs/gateway.md, "The event loop's budget".)
TOKENIZE_INLINE_CHARS = 8192
# What a chat template adds around each message besides its role and content, as an estimate (the byte
# tokenizer's own adds 3 characters, Llama 3's about 30): enough that many empty messages count as the
# work they are, not as nothing. Only the choice of thread depends on it; the size proof measures the
# rendered text itself.
MESSAGE_MARKUP_CHARS = 16


# The headers the generation path reads, by name as the scope has them (lower case: the ASGI spec, and
# uvicorn, give names in lower case, which is what Starlette's `request.headers.get` compares against).
_AUTHORIZATION = b"authorization"
_ATTEMPT = b"x-attempt"
_IDEMPOTENCY_KEY = b"idempotency-key"
_TASK_ID = b"x-task-id"
_WORKFLOW_RUN_ID = b"x-workflow-run-id"
_DEADLINE = b"x-deadline"
_TIMEOUT_MS = b"x-timeout-ms"
_ON_INFEASIBLE = b"x-on-infeasible"
_WANTED = frozenset(
    (
        _AUTHORIZATION,
        _ATTEMPT,
        _IDEMPOTENCY_KEY,
        _TASK_ID,
        _WORKFLOW_RUN_ID,
        _DEADLINE,
        _TIMEOUT_MS,
        _ON_INFEASIBLE,
    )
)
# Where the edge's pre-body check (generation.py, `refuse_spent_tenant`) leaves what it read, so the
# pipeline does not read the headers a second time.
HEADERS_KEY = "fairserve.request_headers"


@dataclass(frozen=True)
class RequestHeaders:
    """The headers a generation request is read from: each its first occurrence's value, None if not sent.

    Read once from the scope's raw list: Starlette's `request.headers.get` scans the whole list per name,
    lower-casing and encoding the name each time, and the path asked for eight names."""

    bearer: str | None  # the Authorization header's bearer token (gateway/edge/auth.py, `bearer_token`)
    attempt: str | None = None
    idempotency_key: str | None = None
    task_id: str | None = None
    workflow_run_id: str | None = None
    deadline: str | None = None
    timeout_ms: str | None = None
    on_infeasible: str | None = None


def request_headers(scope: Scope) -> RequestHeaders:
    """The generation path's headers from the scope, in one pass over its list (left in the scope by the
    edge's pre-body check when it ran: then not read again)."""
    read: RequestHeaders | None = scope.get(HEADERS_KEY)
    if read is not None:
        return read
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _WANTED and name not in found:  # the first occurrence, as Starlette's `get` returns
            found[name] = value
    auth = found.pop(_AUTHORIZATION, None)
    token = bearer_token(auth.decode("latin-1")) if auth is not None else None
    if not found:  # the common request: no header but Authorization
        headers = RequestHeaders(token)
    else:
        text = {name: value.decode("latin-1") for name, value in found.items()}
        headers = RequestHeaders(
            token,
            text.get(_ATTEMPT),
            text.get(_IDEMPOTENCY_KEY),
            text.get(_TASK_ID),
            text.get(_WORKFLOW_RUN_ID),
            text.get(_DEADLINE),
            text.get(_TIMEOUT_MS),
            text.get(_ON_INFEASIBLE),
        )
    scope[HEADERS_KEY] = headers
    return headers


@dataclass(frozen=True)
class Identity:
    """Correlation headers that flow into RequestMeta and the ledger."""

    request_id: str
    task_id: str | None
    workflow_run_id: str | None
    attempt: int
    idempotency_key: str | None


def _checked_id(value: str, header: str, cap: int) -> str:
    if len(value) > cap or not _TOKEN_ID.match(value):
        raise APIError(
            400,
            f"{header} must be 1-{cap} characters of letters, digits and ._:- (not . or ..), to be read back "
            "in a path",
            "invalid_header",
            header,
        )
    return value


def identity(headers: RequestHeaders, request_id: str, refused_id: str | None = None) -> Identity:
    """Read X-Task-Id, X-Workflow-Run-Id, X-Attempt and Idempotency-Key; 400 naming a bad one, and naming
    X-Request-Id when the client sent `refused_id`, one outside the ids' alphabet (the edge then made up
    another: the client could not cancel or read back by the id it sent)."""
    if refused_id is not None:
        _checked_id(refused_id, "x-request-id", REQUEST_ID_MAX)
    attempt = 0
    if headers.attempt is not None:
        attempt_raw = headers.attempt.strip()
        if not attempt_raw.isdigit() or int(attempt_raw) > 1_000_000:
            raise APIError(400, "X-Attempt must be a non-negative integer", "invalid_header", "X-Attempt")
        attempt = int(attempt_raw)
    key = headers.idempotency_key
    if key is not None and not 1 <= len(key) <= 255:
        raise APIError(400, "Idempotency-Key must be 1-255 characters", "invalid_header", "Idempotency-Key")
    return Identity(
        request_id=request_id,
        task_id=None if headers.task_id is None else _checked_id(headers.task_id, "x-task-id", TASK_ID_MAX),
        workflow_run_id=None
        if headers.workflow_run_id is None
        else _checked_id(headers.workflow_run_id, "x-workflow-run-id", WORKFLOW_RUN_ID_MAX),
        attempt=attempt,
        idempotency_key=key,
    )


def deadline(headers: RequestHeaders, now: float) -> float | None:
    """The absolute deadline from X-Deadline / X-Timeout-Ms; 400 when malformed."""
    if headers.deadline is None and headers.timeout_ms is None:  # the common request: none
        return None
    try:
        return parse_deadline(headers.deadline, headers.timeout_ms, now)
    except DeadlineError as exc:
        raise APIError(400, str(exc), "invalid_deadline", exc.header) from None


def parse_body(
    raw: bytes, chat: bool, max_messages: int, max_context: int | None = None, max_depth: int = MAX_JSON_DEPTH
) -> CompletionRequest | ChatCompletionRequest:
    """Validate the JSON body; 400 naming the field for malformed JSON, wrong types or unknown fields, for
    nesting deeper than `max_depth` (measured before any parser, which would recurse: body_depth.py), and
    for more than `max_messages` messages, text parts or entries of any other field but a token-id prompt,
    which must be shorter than `max_context` (the longest context served): counted before validation in a
    large body (gateway/openai/body_shape.py), as validating costs the event loop per entry; a small one
    is validated first (its prompt's length is checked against its model's context when tokenised)."""
    model = ChatCompletionRequest if chat else CompletionRequest
    if not raw.strip():
        raise APIError(400, "request body is empty; send a JSON object", "invalid_json")
    deep = too_deep(raw, max_depth)
    if deep is not None:
        where = f" in {deep.field}" if deep.field is not None else ""
        message = f"the body nests {deep.depth} levels deep{where}; at most {max_depth} are allowed (max_json_depth)"
        raise APIError(400, message, "invalid_value", deep.field)
    if len(raw) > SHAPE_SCAN_BYTES:
        count = count_body(raw, max_messages)
        _check_count(count, max_messages)
        if count is not None and max_context is not None and count.prompt_ids >= max_context:
            message = (
                f"prompt has {count.prompt_ids} tokens; the longest context served here is {max_context}"
            )
            raise APIError(400, message, "context_length_exceeded", "prompt")
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise APIError(400, f"malformed JSON body: {err['msg']}", "invalid_json") from None
        if err["type"] in ("model_type", "model_attributes_type") and not err["loc"]:
            raise APIError(400, "request body must be a JSON object", "invalid_json") from None
        param, message = (unserved_part(raw, exc) if chat else None) or first_error(exc)
        raise APIError(400, message, "invalid_value", param) from None
    if isinstance(body, ChatCompletionRequest) and len(raw) <= SHAPE_SCAN_BYTES:  # the same cap, counted now
        parts = sum(len(m.content) for m in body.messages if isinstance(m.content, list))
        _check_count(BodyCount(len(body.messages), parts), max_messages)
    return body


def _check_count(count: BodyCount | None, cap: int) -> None:
    if count is None:
        return
    for n, what in ((count.messages, "messages"), (count.parts, "text parts")):
        if n > cap:
            raise APIError(
                400, f"messages has {n} {what}; at most {cap} are allowed", "invalid_value", "messages"
            )
    if count.widest is not None and count.widest[1] > cap:
        name, n = count.widest
        raise APIError(400, f"{name} has {n} entries; at most {cap} are allowed", "invalid_value", name)


@dataclass(frozen=True)
class EngineInput:
    """Prompt token ids and sampling parameters, checked against the model's context."""

    prompt_token_ids: list[int]
    params: SamplingParams


async def engine_input_async(
    body: CompletionRequest | ChatCompletionRequest,
    engine: EngineClient,
    offload: Callable[[Callable[[], EngineInput]], Awaitable[Timed[EngineInput]]] | None = None,
    on_loop: Callable[[float], None] | None = None,
) -> tuple[EngineInput, float]:
    """`engine_input` and the CPU seconds it took: inline for a small prompt (its CPU, refused or not, told
    to `on_loop`); for a large one, a text prompt proved too long by its size alone (no tokenising), else
    tokenised (a chat: rendered, proved, encoded) by `offload` (the gateway's preprocessing gate,
    gateway/openai/preprocess.py, which charges it; a worker thread without one)."""
    if prompt_chars(body) <= TOKENIZE_INLINE_CHARS:
        t0 = time.thread_time()
        try:
            inputs = engine_input(body, engine)
        finally:
            cpu = time.thread_time() - t0
            if on_loop is not None:
                on_loop(cpu)
        return inputs, cpu
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, str):
        size_proof(body.prompt, engine, "prompt")
    work = functools.partial(engine_input, body, engine)
    if offload is None:
        return await asyncio.to_thread(work), 0.0
    timed = await offload(work)
    return timed.value, timed.cpu_s


def size_proof(text: str, engine: EngineClient, field_name: str) -> None:
    """400 `context_length_exceeded` for a text whose UTF-8 size alone proves it cannot fit: every token
    covers at most `longest_token_bytes`, so B bytes are at least B / that many tokens."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    per_token = engine.tokenizer.longest_token_bytes
    limit = engine.max_model_len
    if size > (limit - 1) * per_token:
        raise APIError(
            400,
            f"{field_name} is {size} bytes, at least {-(-size // per_token)} tokens (a token covers at most "
            f"{per_token} bytes); this model's context is {limit} tokens",
            "context_length_exceeded",
            field_name,
        )


def prompt_chars(body: CompletionRequest | ChatCompletionRequest) -> int:
    """The characters tokenising this prompt works through: a text prompt's; for a chat, an estimate of what
    its template renders (`template_chars`)."""
    if isinstance(body, ChatCompletionRequest):
        return template_chars(body)
    prompt = body.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return len(prompt[0]) if prompt and isinstance(prompt[0], str) else 0


def template_chars(body: ChatCompletionRequest) -> int:
    """An estimate of the characters the chat template renders, from every piece it is given: each
    message's content, role and name and its markup (`MESSAGE_MARKUP_CHARS`), and the tool definitions'
    JSON when the body carries any. 30,000 empty messages are 30,000 pieces of markup, not 0 characters.
    Counting stops once the markup alone passes `TOKENIZE_INLINE_CHARS` (512 messages): then the chat goes
    off the loop whatever its text, and the loop does not walk every message to learn it."""
    messages = body.messages
    if len(messages) * MESSAGE_MARKUP_CHARS > TOKENIZE_INLINE_CHARS:
        return len(messages) * MESSAGE_MARKUP_CHARS
    chars = sum(len(m.text()) + len(m.role) + len(m.name or "") + MESSAGE_MARKUP_CHARS for m in messages)
    return chars + (len(json.dumps(body.tools, default=str)) if body.tools else 0)


def engine_input(body: CompletionRequest | ChatCompletionRequest, engine: EngineClient) -> EngineInput:
    """Check the caps, tokenise, resolve max_tokens and validate everything the engine would refuse."""
    if body.model != engine.model_name:
        raise APIError(
            400,
            f"model {body.model!r} does not exist; this server serves {engine.model_name!r}",
            "model_not_found",
            "model",
        )
    caps: RequestCaps = engine.caps
    params = body.sampling(None)
    # Structured outputs (gateway/openai/structured.py), or a required tool call (gateway/openai/tools.py).
    params.grammar = response_grammar(body.response_format)
    if isinstance(body, ChatCompletionRequest) and (body.tools is not None or body.tool_choice is not None):
        tools.check(body)
        params.grammar = params.grammar or tools.tool_grammar(body, engine.tokenizer)
    try:
        params.validate()
        caps.check(params)
    except InvalidRequestError as exc:
        field_name = exc.field_name
        if field_name == "logprobs" and isinstance(body, ChatCompletionRequest):
            field_name = "top_logprobs"  # chat's count of alternatives (its `logprobs` is a boolean)
        raise APIError(400, str(exc), "invalid_value", field_name) from None
    ids, requested, max_param, prompt_param = _tokens(body, engine, caps)
    if not ids:
        raise APIError(400, f"{prompt_param} encodes to no tokens", "invalid_value", prompt_param)
    limit = engine.max_model_len
    if len(ids) >= limit:
        raise APIError(
            400,
            f"{prompt_param} has {len(ids)} tokens; this model's context is {limit} tokens",
            "context_length_exceeded",
            prompt_param,
        )
    if requested is not None and requested < 1:
        raise APIError(400, f"{max_param} must be >= 1, got {requested}", "invalid_value", max_param)
    if requested is None:
        requested = limit - len(ids)
    if len(ids) + requested > limit:
        raise APIError(
            400,
            f"{max_param}={requested} plus {len(ids)} prompt tokens exceeds the {limit}-token context",
            "context_length_exceeded",
            max_param,
        )
    params.max_tokens = requested
    return EngineInput(ids, params)


def _tokens(
    body: CompletionRequest | ChatCompletionRequest, engine: EngineClient, caps: RequestCaps
) -> tuple[list[int], int | None, str, str]:
    """(prompt token ids, requested max tokens, its field name, the prompt's field name); 400 over a cap."""
    tok = engine.tokenizer
    if isinstance(body, ChatCompletionRequest):
        try:
            texts = [m.text() for m in body.messages]  # once per message: the cap's check and the template
            caps.check_prompt_text("".join(texts), "messages")
            messages = [tools.template_message(m, t) for m, t in zip(body.messages, texts, strict=True)]
            rendered = tok.apply_chat_template(messages, tools=tools.template_tools(body))
            size_proof(rendered, engine, "messages")  # what the template rendered, before encoding it
            ids = tok.encode_rendered_chat(rendered)
        except ValueError as exc:  # InvalidRequestError (over the cap) or a chat template refusal
            raise APIError(400, str(exc), "invalid_value", "messages") from None
        max_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        return ids, body.requested_max_tokens, max_param, "messages"
    prompt = body.prompt
    text = (
        prompt
        if isinstance(prompt, str)
        else (str(prompt[0]) if prompt and isinstance(prompt[0], str) else None)
    )
    if text is not None:
        try:
            caps.check_prompt_text(text, "prompt")
        except InvalidRequestError as exc:
            raise APIError(400, str(exc), "invalid_value", "prompt") from None
        ids = tok.encode(text)
    else:
        ids = [int(t) for t in prompt]
    return ids, body.max_tokens if body.max_tokens is not None else 16, "max_tokens", "prompt"
