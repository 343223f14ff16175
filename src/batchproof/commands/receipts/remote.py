"""A Host over HTTP: a running batchproof server (ours, or one replica of a fleet) re-executes
receipts through its public /v1/completions, token ids in and out (return_tokens_as_token_ids
names every alternative by id), many at once so its engine batches them. Its model facts come
from /v1/server_info."""

import concurrent.futures
import math

import httpx

from batchproof.commands.receipts.scoring import PromptJob, ScoreJob
from batchproof.common.wire import ABSENT_LOGPROB
from batchproof.notary.receipts.format import Entry, Outcome, PromptEntry

CONCURRENCY = 16  # requests in flight: a server's batch at its default --max-batch
FACTS = ("model_sha256", "numerics_id", "tokenizer_sha256", "chat_template_sha256", "max_model_len")


class RemoteError(RuntimeError):
    """The server cannot verify receipts (unreachable, or not a batchproof server that names its hashes)."""


def _float(value: float) -> float:
    return -math.inf if value == ABSENT_LOGPROB else float(value)


def _id(spelled: str) -> int:
    return int(spelled.removeprefix("token_id:"))


def _legacy_entries(logprobs: dict, start: int) -> list[Entry]:
    """Entries from a legacy logprobs object spelled by id, from position `start` on."""
    tails = logprobs.get("tail_logprobs")
    entries = []
    for p in range(start, len(logprobs["tokens"])):
        top = tuple((_id(key), _float(value)) for key, value in (logprobs["top_logprobs"][p] or {}).items())
        tail = None if tails is None or tails[p] is None else _float(tails[p])
        entries.append((_id(logprobs["tokens"][p]), _float(logprobs["token_logprobs"][p]), top, tail))
    return entries


def _end_entry(end: dict) -> Entry:
    tail = end.get("tail_logprob")
    return (end["token_id"], _float(end["logprob"]),
            tuple((_id(alt["token"]), _float(alt["logprob"])) for alt in end["top_logprobs"]),
            None if tail is None else _float(tail))


def _prompt_entries(choice: dict, job: PromptJob) -> tuple[PromptEntry, ...]:
    """Positions 1 on of an echoed prompt, each with its named ids' logprobs where it has a row."""
    rows = choice.get("prompt_token_id_logprobs") or []
    named = {job.start + 1 + i: tuple(_float(v) for v in row) for i, row in enumerate(rows)}
    return tuple((*e, named.get(position)) for position, e in enumerate(_legacy_entries(choice["logprobs"], 1), 1))


def generate_body(prompt: list[int], params: dict) -> dict:
    """A receipt's params as a /v1/completions request for the same bits."""
    body = {"prompt": prompt, "return_tokens_as_token_ids": True, "receipt": True,
            **{name: params[name] for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                               "repetition_penalty", "presence_penalty", "frequency_penalty",
                                               "logit_bias", "stop", "ignore_eos", "min_tokens", "logprobs_mode")}}
    if params["seed"] is not None:
        body["seed"] = params["seed"]
    if params["max_tokens"] == 0:  # a prompt scored alone: the route takes 0 only with echo (its prompt
        body["echo"] = True        # is scored apart, score_prompts; the echoed entries are skipped)
    if params["top_logprobs"] is not None:
        body["logprobs"] = params["top_logprobs"]
        body["return_tail_logprobs"] = params["tail_logprobs"]
    return body


class RemoteHost:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def facts(self) -> dict:
        try:
            info = self.client.get("/v1/server_info").raise_for_status().json()
        except (httpx.HTTPError, ValueError) as e:
            raise RemoteError(f"cannot read {self.client.base_url}/v1/server_info ({e})") from None
        missing = [name for name in FACTS if name not in info]
        if missing:
            raise RemoteError(f"{self.client.base_url}/v1/server_info does not name {', '.join(missing)}: "
                              "not a batchproof server that writes receipts")
        return {name: info[name] for name in FACTS}

    def _post(self, body: dict) -> dict | str:
        try:
            response = self.client.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            return f"the request failed ({e})"
        if response.status_code != 200:
            try:
                return f"HTTP {response.status_code}: {response.json()['error']['message']}"
            except (ValueError, KeyError, TypeError):
                return f"HTTP {response.status_code}"
        return response.json()["choices"][0]

    def _each(self, bodies: list[dict]) -> list[dict | str]:
        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            return list(pool.map(self._post, bodies))

    def replay(self, receipts: list[dict]) -> list[Outcome | str | None]:
        """A server shows no logits rows: every receipt is scored or generated there."""
        return [None] * len(receipts)

    def score(self, jobs: list[ScoreJob]) -> list[list[Entry] | str]:
        bodies = [{"prompt": job.token_ids, "max_tokens": 0, "echo": True, "logprobs": job.num_alternatives,
                   "return_tail_logprobs": job.tails, "return_tokens_as_token_ids": True} for job in jobs]
        return [choice if isinstance(choice, str) else _legacy_entries(choice["logprobs"], job.num_prompt)
                for job, choice in zip(jobs, self._each(bodies))]

    def score_prompts(self, jobs: list[PromptJob]) -> list[tuple[PromptEntry, ...] | str]:
        """Each prompt echoed and scored alone (max_tokens 0): echo's legacy entries, spelled by id,
        hold every alternative the records do (logprobs = their number) and the tails unjoined;
        prompt_token_id_logprobs the named ids' rows."""
        bodies = []
        for job in jobs:
            body = {"prompt": job.prompt_ids, "max_tokens": 0, "echo": True, "logprobs": job.num_alternatives,
                    "return_tail_logprobs": job.tails, "return_tokens_as_token_ids": True}
            if job.named is not None:
                body |= {"prompt_logprob_token_ids": [list(row) for row in job.named],
                         "prompt_logprob_start": job.start}
            bodies.append(body)
        return [choice if isinstance(choice, str) else _prompt_entries(choice, job)
                for job, choice in zip(jobs, self._each(bodies))]

    def generate(self, jobs: list[tuple[list[int], dict]]) -> list[Outcome | str]:
        bodies = [generate_body(prompt, params) for prompt, params in jobs]
        refused = "a grammar-constrained reply is re-executed in process only (--model, not --url)"
        choices = iter(self._each([b for b, (_, params) in zip(bodies, jobs) if params["constraint"] is None]))
        return [refused if params["constraint"] is not None else self._outcome(next(choices), params, len(prompt))
                for prompt, params in jobs]

    @staticmethod
    def _outcome(choice: dict | str, params: dict, num_prompt: int) -> Outcome | str:
        """A generated choice as what it produced: its tokens and ending as its own receipt names
        them, its entries read from its logprobs (so the digest is computed here, not taken)."""
        if isinstance(choice, str):
            return choice
        theirs = choice["receipt"]
        entries = None
        if params["top_logprobs"] is not None:
            end = choice.get("end_token")
            echoed = num_prompt if params["max_tokens"] == 0 else 0  # the prompt's entries come first
            entries = tuple(_legacy_entries(choice["logprobs"], echoed)) + ((_end_entry(end),) if end else ())
        return Outcome(tuple(theirs["output_token_ids"]), theirs["end_token_id"], theirs["finish_reason"],
                       theirs["num_generated_tokens"], entries)
