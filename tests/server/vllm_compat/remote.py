"""What vLLM's OpenAI-server tests import, on our server: their `RemoteOpenAIServer` (the live
server around the shared engine, with the client they ask it for) and `get_tokenizer` (the served
model's own tokenizer, with the encode and decode calls the tests make)."""

import openai

from batchproof.engine.text.tokenizer import Tokenizer

# The default model as the server names it (checked against the live server in conftest.py).
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"


class ServedTokenizer:
    """transformers' encode and decode as vLLM's tests call them: encode adds what the model's
    tokenizer adds to a text (no BOS for SmolLM2), decode spells special tokens (`<|im_end|>`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_bos=self._tokenizer.ids.add_bos)

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids)


class RemoteOpenAIServer:
    """vLLM's test server handle, over one of ours (tests/helpers/live_server.py)."""

    def __init__(self, live) -> None:
        self.live = live

    def get_async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.live.url}/v1", api_key="unused", max_retries=0)

    def get_tokenizer(self) -> ServedTokenizer:
        return ServedTokenizer(self.live.state.front.tokenizer)
