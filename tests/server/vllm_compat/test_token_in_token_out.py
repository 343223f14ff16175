# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM's tests/entrypoints/openai/test_token_in_token_out.py, adapted: their server (Qwen3-0.6B
with dummy weights, --skip-tokenizer-init) swapped for ours around the default model, their
tokenizer for the served one. The test body is theirs. A chat variant (`messages: []` beside
`prompt_token_ids`) follows in the same shape: the stored copy of their file has only the
completions test."""

import pytest

from tests.server.vllm_compat.remote import MODEL_NAME

MODEL_PATH = MODEL_NAME  # theirs is a local copy of the checkpoint; ours serves it by name


@pytest.mark.asyncio
async def test_token_in_token_out_and_logprobs(server):
    """
    Test token-in-token-out and token_ids align with prompt_logprobs
    & logprobs when return_tokens_as_token_ids is enabled.
    """
    tokenizer = server.get_tokenizer()  # theirs: get_tokenizer(tokenizer_name=MODEL_NAME)
    text = "Hello, world! How are you today?"
    token_ids = tokenizer.encode(text)
    async with server.get_async_client() as client:
        # Test with both return_token_ids and return_tokens_as_token_ids enabled
        completion = await client.completions.create(
            model=MODEL_PATH,
            prompt=token_ids,
            max_tokens=20,
            temperature=0,
            echo=True,
            extra_body={
                "return_token_ids": True,
            },
        )

        # Verify all fields are present
        assert (completion.choices[0].token_ids is not None
                and 0 < len(completion.choices[0].token_ids) <= 20)
        assert completion.choices[0].prompt_token_ids is not None

        # Decode prompt tokens
        if completion.choices[0].prompt_token_ids:
            prompt_text = tokenizer.decode(
                completion.choices[0].prompt_token_ids)
            # The decoded prompt should match or close to original prompt
            assert prompt_text == text


@pytest.mark.asyncio
async def test_chat_token_in_token_out(server):
    """Ours, in their shape: the chat prompt sent as ids with `messages: []` gives the reply of
    the messages that render to them, ids and token_id:N entries alike."""
    async with server.get_async_client() as client:
        rendered = await client.chat.completions.create(
            model=MODEL_PATH,
            messages=[{"role": "user", "content": "Hello, world! How are you today?"}],
            max_tokens=20,
            temperature=0,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        completion = await client.chat.completions.create(
            model=MODEL_PATH,
            messages=[],
            max_tokens=20,
            temperature=0,
            logprobs=True,
            extra_body={
                "prompt_token_ids": rendered.prompt_token_ids,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            },
        )
        assert completion.prompt_token_ids == rendered.prompt_token_ids
        assert completion.choices[0].token_ids == rendered.choices[0].token_ids
        assert completion.choices[0].message.content == rendered.choices[0].message.content
        logprob_ids = [int(e.token.removeprefix("token_id:")) for e in completion.choices[0].logprobs.content]
        assert logprob_ids == completion.choices[0].token_ids[:len(logprob_ids)]
