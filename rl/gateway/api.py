"""The OpenAI API's requests as sarl reads them, and its error shape.

Every field of the official API that the endpoint serves is checked here,
before anything reaches an engine, so that a request it would fail on is
refused with a 400 that names the field (`param`). Fields an agent program
commonly sends but that change nothing here (`user`, `metadata`, `store`,
`parallel_tool_calls`) are taken and ignored; fields whose effect sarl does
not have (`presence_penalty`, `frequency_penalty`, `logit_bias`, a JSON
`response_format`, `top_logprobs` above 0, `echo`, `suffix`, `best_of`) are
taken at their neutral value only and refused otherwise; any other field is
refused as unknown, as the official API does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rl.engine.config import MAX_STOP_CHARS, Temperature, TopP


class ApiError(Exception):
    """An answer in the OpenAI error shape:
    `{"error": {"message", "type", "param", "code"}}` with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(status: int, message: str) -> bytes:
    """The bytes of an error answer with no request behind it (the intake's
    refusals: too slow, too large, too busy)."""
    kind = {401: "authentication_error", 429: "rate_limit_error", 503: "server_error"}.get(
        status, "invalid_request_error"
    )
    return json.dumps(ApiError(status, message, kind).body()).encode()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loose(BaseModel):
    """Parts of a message a client echoes back from a response (`refusal`,
    `annotations`, `audio`): taken and ignored."""

    model_config = ConfigDict(extra="ignore")


class TextPart(_Loose):
    type: Literal["text"]
    text: str


class FunctionCall(_Loose):
    name: str = Field(min_length=1, max_length=256)
    arguments: str
    """A JSON object, as text (the API's form)."""

    def parsed(self) -> Any:
        try:
            return json.loads(self.arguments)
        except (ValueError, RecursionError):
            return self.arguments  # rendered as the client sent it


class ToolCall(_Loose):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDecl(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDecl(_Strict):
    type: Literal["function"]
    function: FunctionDecl


class NamedFunction(_Strict):
    name: str


class NamedTool(_Strict):
    type: Literal["function"]
    function: NamedFunction


Stop = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None


class _Sampling(_Strict):
    model: str
    n: int = Field(1, ge=1)
    temperature: Annotated[Temperature, Field(le=2.0)] = 1.0  # the engines' rule, within the OpenAI API's range
    top_p: TopP = 1.0
    stop: Stop = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported: 0 only")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    def stops(self) -> list[str]:
        out = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if sum(len(s) for s in out) > MAX_STOP_CHARS:
            raise ApiError(
                400, f"stop: {sum(len(s) for s in out)} characters in all; at most {MAX_STOP_CHARS}", param="stop"
            )
        return out

    def usage_in_stream(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDecl] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "text":
            raise ValueError('only {"type": "text"} is supported')
        return v

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=1)
    echo: Literal[False] = False
    suffix: None = None
    best_of: Literal[1] | None = None


def parse(model: type[_Sampling], body: bytes) -> Any:
    """The request in `body`, or ApiError(400) naming the first bad field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ApiError(400, f"Unrecognized request argument supplied: {param}", param=param) from None
        raise ApiError(400, f"{param}: {err['msg']}", param=param) from None
