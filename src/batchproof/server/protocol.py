"""The OpenAI request fields we support, as strict pydantic models (JSON in, no coercion)."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TopLogprobs = Annotated[StrictInt, Field(ge=0, le=20)]
LegacyLogprobs = Annotated[StrictInt, Field(ge=0, le=5)]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# What torch.Generator.manual_seed takes: any int64 or uint64.
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)]


class _Strict(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do; known ones are typed strictly.
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, str]:
        """As the chat template reads it: OpenAI's `developer` role is the system prompt."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class SamplingFields(_Strict):
    """Fields shared by chat and legacy completions (OpenAI's and vLLM's extensions)."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: StrictInt | None = None  # null means the default, as OpenAI reads it
    stop: StrictStr | list[StrictStr] | None = None
    seed: Seed | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[StrictStr, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: StrictStr | None = None
    # vLLM / llama.cpp extensions
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None


class CompletionRequest(SamplingFields):
    prompt: StrictStr | list[StrictInt] | list[StrictStr]
    logprobs: LegacyLogprobs | None = None
    echo: StrictBool | None = None


class TokenizeRequest(_Strict):
    prompt: StrictStr | None = None
    content: StrictStr | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Strict):
    tokens: list[StrictInt]
