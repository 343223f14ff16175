"""Rollouts for the notary's tests: sampled through our own server with the official openai client
(logprobs and return_token_ids, as a trainer takes them), as the records the notary reads."""

import openai

PROMPTS = ["Write one sentence about the sea.", "Name a fruit.", "Count to five."]


def own_rollouts(url: str, num_per_prompt: int = 2, max_tokens: int = 8, seed: int = 0) -> list[dict]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    records = []
    for p, prompt in enumerate(PROMPTS):
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=[{"role": "user", "content": prompt}],
            n=num_per_prompt, temperature=1.0, seed=seed + p, max_tokens=max_tokens, logprobs=True,
            extra_body={"return_token_ids": True})
        for choice in reply.choices:
            logprobs = [entry.logprob for entry in choice.logprobs.content]
            ids = list(choice.token_ids)
            end = getattr(choice, "end_token", None)  # the end-of-turn token's entry, where the reply has one
            if end is not None and len(ids) == len(logprobs) + 1:
                logprobs.append(end["logprob"])
            records.append({"id": f"{p}-{choice.index}", "prompt_token_ids": list(reply.prompt_token_ids),
                            "completion_token_ids": ids, "logprobs": logprobs})
    return records
