"""The end-of-turn token that ended a reply (docs/rl-rollouts.md): its id last in `token_ids`, its
entry in the choice's `end_token` (never in logprobs.content, which stays one entry per text
token), streamed on the final chunk as whole; re-scoring prompt + token_ids gives its bits,
through echo and prompt_logprobs, for a reply alone and inside a batch of 16."""

from concurrent.futures import ThreadPoolExecutor

from tests.helpers.http import chunks, messages, post, stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Short answers the default model ends on its own (<|im_end|>, id 2) well inside MAX_TOKENS.
PROMPTS = ["Say hi.", "What is 2+2?", "Name a color.", "Say yes or no."]
MAX_TOKENS = 48
BATCH = 16


def _chat(prompt: str, temperature: float = 0.0, seed: int = 0, **fields) -> dict:
    return {"messages": messages(prompt), "temperature": temperature, "seed": seed, "max_tokens": MAX_TOKENS,
            "logprobs": True, "top_logprobs": 3, "return_token_ids": True, **fields}


def _ended(reply: dict) -> tuple[list[int], dict]:
    """(prompt + reply ids, the end entry) of a chat reply that its end token ended."""
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "stop", reply
    return reply["prompt_token_ids"] + choice["token_ids"], choice["end_token"]


def _rescored(url: str, prompts: list[list[int]]) -> list[tuple[float, float, list]]:
    """Each prompt's last token scored: (by echo, by prompt_logprobs, echo's top 3)."""
    echo = post(url, COMPLETIONS, {"prompt": prompts, "echo": True, "max_tokens": 0, "logprobs": 3}).json()
    scored = post(url, COMPLETIONS, {"prompt": prompts, "max_tokens": 1, "temperature": 0,
                                     "prompt_logprobs": 0}).json()
    result = []
    for ids, by_echo, by_prompt in zip(prompts, echo["choices"], scored["choices"], strict=True):
        echoed, end = by_echo["logprobs"], by_prompt["prompt_logprobs"][-1][str(ids[-1])]
        result.append((echoed["token_logprobs"][-1], end["logprob"], echoed["top_logprobs"][-1]))
    return result


def test_the_end_token_rides_beside_the_entries_and_last_in_the_ids(server) -> None:
    tokenizer = server.state.front.tokenizer
    reply = post(server.url, CHAT, _chat(PROMPTS[0])).json()
    (choice,) = reply["choices"]
    ids, end = _ended(reply)
    entries = choice["logprobs"]["content"]
    assert choice["token_ids"][-1] == end["token_id"] in tokenizer.ids.end_of_turn_ids
    assert len(entries) == len(choice["token_ids"]) - 1 == reply["usage"]["completion_tokens"]
    assert "<|im_end|>" not in choice["message"]["content"] and end["token"] == "<|im_end|>"
    assert set(end) == {"token_id", "token", "logprob", "bytes", "top_logprobs"} and len(end["top_logprobs"]) == 3
    assert end["logprob"] == next(alt["logprob"] for alt in end["top_logprobs"] if alt["token"] == end["token"])
    # Streamed: the same ids, the end id and entry on the final chunk only.
    body = chunks(stream(server.url, CHAT, _chat(PROMPTS[0]))[2])
    finals = [c["choices"][0] for c in body if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(finals) == 1 and finals[0]["end_token"] == end and finals[0]["token_ids"][-1] == end["token_id"]
    assert [i for c in body[1:] for i in c["choices"][0].get("token_ids", [])] == choice["token_ids"]
    assert sum("end_token" in c["choices"][0] for c in body if c["choices"]) == 1


def test_no_end_token_where_none_ended_the_reply(server) -> None:
    cut = post(server.url, CHAT, _chat(PROMPTS[0], max_tokens=2)).json()["choices"][0]
    assert cut["finish_reason"] == "length" and "end_token" not in cut and len(cut["token_ids"]) == 2
    # Without logprobs the id is still last in token_ids, but no entry is made up.
    plain = post(server.url, CHAT, _chat(PROMPTS[0], logprobs=False, top_logprobs=None)).json()["choices"][0]
    assert "end_token" not in plain and plain["token_ids"][-1] == 2


def test_rescoring_gives_the_end_tokens_bits_alone(server) -> None:
    ids, end = _ended(post(server.url, CHAT, _chat(PROMPTS[1])).json())
    ((by_echo, by_prompt, top),) = _rescored(server.url, [ids])
    assert by_echo == by_prompt == end["logprob"]
    assert list(top.values()) == [alt["logprob"] for alt in end["top_logprobs"]]


def test_rescoring_gives_the_end_tokens_bits_in_a_batch(server) -> None:
    """16 rollouts at once (greedy and sampled), then all scored in one request: every end entry
    equals its re-scoring, and equals the same rollout run alone."""
    bodies = [_chat(PROMPTS[i % len(PROMPTS)], temperature=0.0 if i < len(PROMPTS) else 1.0, seed=i)
              for i in range(BATCH)]
    with ThreadPoolExecutor(BATCH) as pool:
        replies = list(pool.map(lambda b: post(server.url, CHAT, b).json(), bodies))
    ended = [_ended(r) for r in replies if r["choices"][0]["finish_reason"] == "stop"]
    assert len(ended) >= BATCH // 2, [r["choices"][0]["finish_reason"] for r in replies]
    for (_ids, end), (by_echo, by_prompt, _) in zip(ended, _rescored(server.url, [ids for ids, _ in ended])):
        assert by_echo == by_prompt == end["logprob"]
    alone = post(server.url, CHAT, bodies[-1]).json()
    assert alone["choices"][0]["token_ids"] == replies[-1]["choices"][0]["token_ids"]
    assert alone["choices"][0].get("end_token") == replies[-1]["choices"][0].get("end_token")


def test_completions_carry_the_end_token_too(server) -> None:
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    body = {"prompt": prompt, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 2, "return_token_ids": True}
    (choice,) = post(server.url, COMPLETIONS, body).json()["choices"]
    assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == choice["end_token"]["token_id"]
    assert len(choice["logprobs"]["tokens"]) == len(choice["token_ids"]) - 1
    assert len(choice["end_token"]["top_logprobs"]) == 2
    streamed = chunks(stream(server.url, COMPLETIONS, body)[2])
    assert streamed[-1]["choices"][0]["end_token"] == choice["end_token"]
    ((by_echo, _, _),) = _rescored(server.url, [choice["prompt_token_ids"] + choice["token_ids"]])
    assert by_echo == choice["end_token"]["logprob"]
