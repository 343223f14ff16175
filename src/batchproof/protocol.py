"""The OpenAI request fields we support, as strict pydantic models (JSON in, no coercion)."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TopLogprobs = Annotated[StrictInt, Field(ge=0, le=20)]
LegacyLogprobs = Annotated[StrictInt, Field(ge=0, le=5)]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


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


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class SamplingFields(_Strict):
    """Fields shared by chat and legacy completions (OpenAI's and vLLM's extensions)."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[StrictStr, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: StrictStr | None = None
    # vLLM / llama.cpp extensions
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    ignore_eos: StrictBool = False
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None


class CompletionRequest(SamplingFields):
    prompt: StrictStr | list[StrictInt] | list[StrictStr]
    logprobs: LegacyLogprobs | None = None
    echo: StrictBool = False


class TokenizeRequest(_Strict):
    prompt: StrictStr | None = None
    content: StrictStr | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Strict):
    tokens: list[StrictInt]
