"""A request's output constraint, from OpenAI's `response_format` or vLLM's `structured_outputs`:
built and checked against the model's tokenizer before the request runs, so a schema feature
the engine cannot enforce is a 400 naming it, never a 200 with unconstrained text."""

import json
from typing import Any

from batchproof.engine.grammar import compile as grammars
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import APIError
from batchproof.server.request.protocol import ResponseFormat, StructuredOutputs

# A schema's compile costs time in its size (64 KB of flat properties: ~0.1 s), so it is bounded
# before any (a tool's parameters too, tools/choice.py): far above a real schema's.
MAX_SCHEMA_CHARS = 64 * 1024


def _built(make: Any, param: str, *args: Any) -> Constraint:
    try:
        return make(*args)
    except (ValueError, TypeError) as e:  # a schema that is not a JSON object, a grammar it cannot read
        raise APIError(400, f"'{param}' cannot be enforced: {e}", param=param) from None


def _schema(schema: dict | str, param: str) -> Constraint:
    """A JSON schema's constraint, its size checked first (as JSON text, the form it compiles from)."""
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    except (ValueError, RecursionError):  # nested deeper than the encoder goes
        raise APIError(400, f"'{param}' is nested too deeply to be enforced", param=param) from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise APIError(400, f"'{param}' is {len(text)} characters of JSON; at most {MAX_SCHEMA_CHARS} are taken",
                       param=param)
    return _built(grammars.json_schema, param, text)


def from_response_format(response_format: ResponseFormat) -> Constraint | None:
    if response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return grammars.json_object()
    if response_format.json_schema is None:
        raise APIError(400, "'response_format' of type 'json_schema' needs its 'json_schema' object",
                       param="response_format.json_schema")
    schema = response_format.json_schema.schema_
    if schema is None:
        raise APIError(400, "'response_format.json_schema' needs its 'schema'", param="response_format.json_schema")
    return _schema(schema, "response_format.json_schema.schema")


def from_structured_outputs(structured: StructuredOutputs) -> Constraint:
    """vLLM's `structured_outputs`: exactly one of json, json_object, regex, choice, grammar."""
    values = {"json": structured.json_, "json_object": structured.json_object, "regex": structured.regex,
              "choice": structured.choice, "grammar": structured.grammar}
    given = [name for name, value in values.items() if value not in (None, False)]
    if len(given) != 1:
        raise APIError(400, f"'structured_outputs' takes exactly one of json, json_object, regex, choice, grammar; "
                            f"got {given or 'none'}", param="structured_outputs")
    name = given[0]
    param = f"structured_outputs.{name}"
    if name == "json":
        return _schema(structured.json_, param)
    if name == "json_object":
        return grammars.json_object()
    if name == "regex":
        return _built(grammars.regex, param, structured.regex)
    if name == "choice":
        if not structured.choice:
            raise APIError(400, "'structured_outputs.choice' must hold at least one string, got []", param=param)
        return _built(grammars.choice, param, structured.choice)
    return _built(grammars.grammar, param, structured.grammar)


def request_constraint(response_format: ResponseFormat | None, structured: StructuredOutputs | None,
                       tokenizer: Tokenizer) -> Constraint | None:
    """The constraint a request asks for (None: free text), checked against the tokenizer."""
    constraint = from_response_format(response_format) if response_format is not None else None
    param = "response_format"
    if structured is not None:
        if constraint is not None:
            raise APIError(400, "'response_format' and 'structured_outputs' both constrain the reply; send one",
                           param="structured_outputs")
        constraint, param = from_structured_outputs(structured), "structured_outputs"
    if constraint is not None:
        check(constraint, tokenizer, param)
    return constraint


def check(constraint: Constraint, tokenizer: Tokenizer, param: str) -> None:
    try:
        grammars.check(constraint, tokenizer)
    except grammars.GrammarError as e:
        raise APIError(400, f"'{param}' cannot be enforced: {e}", param=param) from None
