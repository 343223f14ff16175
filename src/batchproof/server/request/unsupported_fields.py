"""What we do with OpenAI request fields we do not honour: refuse them, or ignore a few on purpose.

Unknown fields are refused too (every request model extends `Strict`, which forbids extras): a
server whose promise is "never a 200 without what you asked for" cannot drop a field it does not
understand. The table of every field is in docs/api-fields.md.
"""

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    # Unknown fields are refused (this module's docstring says why); known ones are typed strictly.
    model_config = ConfigDict(strict=True, extra="forbid")


# Accepted and ignored on purpose: bookkeeping for the caller or for OpenAI's billing and
# storage, with no effect on the tokens or logprobs a server computes.
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")


def _refuse_unless(allowed: Any, reason: str) -> Any:
    def check(value: Any) -> Any:
        if value is not None and value not in allowed:
            raise PydanticCustomError("unsupported", "not supported by batchproof: {reason}", {"reason": reason})
        return value

    return AfterValidator(check)


def refused(reason: str, allowed: tuple = ()) -> Any:
    """A field we do not implement: null (or one of `allowed`, the values that change nothing) passes;
    anything else is a 400 naming the field."""
    return Annotated[Any, _refuse_unless(allowed, reason)]


NO_TOOLS = "the legacy `functions` and `function_call` are not implemented; use `tools` and `tool_choice`"
