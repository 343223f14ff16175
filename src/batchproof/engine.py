"""The engine: owns the model and the KV cache, and advances every live request one token per step."""

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from batchproof.chat_template import ChatTemplate
from batchproof.config import EngineConfig
from batchproof.default_model import default_model_path
from batchproof.gguf_file import ModelLoadError, ModelSpec, read_model_file
from batchproof.hashing import file_sha256
from batchproof.kv_cache import KVCache
from batchproof.logprobs import TokenRecord, build_records
from batchproof.model import Transformer
from batchproof.model_runner import ModelRunner
from batchproof.sampler import SamplingError, apply_penalties, banned_for_step, choose_token, greedy_tokens
from batchproof.sampling_params import SamplingParams
from batchproof.scheduler import Scheduler
from batchproof.sequence import RequestOutput, Sequence, Status
from batchproof.text_stream import TextDelta, TextStream
from batchproof.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class BatchSummary:
    """One busy period of the engine, from the first admission until it went idle."""

    max_batch_size: int  # the most sequences running together
    duration_s: float
    num_tokens: int


@dataclass
class _Choice:
    token_id: int | None
    record: TokenRecord | None
    error: str | None = None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.num_threads = config.num_threads or os.cpu_count() or 1
        torch.set_num_threads(self.num_threads)
        if self.device.type == "cuda":  # TF32 would round float32 matmuls to 10-bit mantissas
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        started = time.perf_counter()
        self.model_path = Path(config.model_path) if config.model_path else default_model_path()
        model_file = read_model_file(self.model_path)
        self.spec: ModelSpec = model_file.spec
        try:
            self.tokenizer = Tokenizer(model_file.metadata)
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{self.model_path}: unusable tokenizer ({e})") from None
        self.chat_template = ChatTemplate(
            model_file.metadata.get("tokenizer.chat_template"),
            bos_token=self._spelling(self.tokenizer.ids.bos_id),
            eos_token=self._spelling(self.tokenizer.ids.eos_id),
        )
        self.max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, self.spec.context_len)
        with torch.inference_mode():
            self.model = Transformer.from_model_file(model_file, self.device, self.dtype, self.max_model_len,
                                                     self.num_threads, config.is_batch_invariant)
        del model_file
        s = self.spec
        self.cache = KVCache(s.num_layers, config.max_batch, s.num_kv_heads, self.max_model_len, s.head_dim,
                             self.device, self.dtype)
        self.runner = ModelRunner(self.model, self.cache, config.max_batch, config.max_prefill_tokens)
        self.scheduler = Scheduler(config.max_batch, config.max_prefill_tokens)
        self.end_ids = self.tokenizer.ids.end_of_turn_ids
        self.model_sha256 = file_sha256(self.model_path)
        self.load_time_s = time.perf_counter() - started
        self._sequences: dict[str, Sequence] = {}
        self._batch_start: float | None = None
        self._batch_max = 0
        self._batch_tokens = 0

    def _spelling(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokenizer.spelling(token_id)

    # --- requests --------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; a ValueError names what cannot run (the server checks these first)."""
        self._check_request(request_id, prompt_ids, params)
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        elif not params.is_greedy:
            generator = torch.Generator().manual_seed(secrets.randbits(63))
        else:
            generator = None
        seq = Sequence(request_id, list(prompt_ids), params, TextStream(self.tokenizer, params.stop), generator)
        self._sequences[request_id] = seq
        self.scheduler.add(seq)

    def _check_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        vocab = self.tokenizer.vocab_size
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_ids:
            raise ValueError("the prompt is empty (0 tokens)")
        room = self.max_model_len - (1 if params.max_tokens > 0 else 0)
        if len(prompt_ids) > room:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context holds {self.max_model_len}")
        bad = [i for i in (*prompt_ids, *params.logit_bias) if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")

    def abort(self, request_id: str) -> None:
        seq = self._sequences.get(request_id)
        if seq is not None and seq.status is not Status.FINISHED:
            seq.is_aborted = True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # --- the step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        outputs = self._report_retired(scheduled.retired)
        seqs = scheduled.prefill or scheduled.decode
        if seqs:
            self._note_batch(len(self.scheduler.running))
            logits, prompt_records = self._forward(scheduled.prefill, scheduled.decode)
            choices = self._sample_and_record(seqs, logits)
            outputs += self._emit(seqs, choices, prompt_records)
        return outputs

    def _forward(self, prefill: list[Sequence], decode: list[Sequence]) -> tuple[torch.Tensor, list]:
        """Logits [len(seqs), V] for the next token of each scheduled sequence."""
        if not prefill:
            return self.runner.decode(decode), [None] * len(decode)
        results = self.runner.prefill(prefill)
        return torch.stack([logits for logits, _ in results]), [records for _, records in results]

    def _sample_and_record(self, seqs: list[Sequence], logits: torch.Tensor) -> list[_Choice]:
        rows = [apply_penalties(logits[i], s.params, s.seen_ids, s.output_counts) for i, s in enumerate(seqs)]
        choices = self._choose(seqs, rows)
        # Records read the same logits the choice read, after it: asking for them changes nothing.
        wanted = [i for i, (s, c) in enumerate(zip(seqs, choices)) if s.wants_records and c.token_id is not None]
        if wanted:
            records = build_records(
                torch.stack([rows[i] for i in wanted]),
                [choices[i].token_id for i in wanted],
                [seqs[i].params.top_logprobs for i in wanted],
                [len(seqs[i].output_ids) for i in wanted],
            )
            for i, record in zip(wanted, records):
                if record.logprob != record.logprob:  # NaN: the normaliser saw no finite logit
                    choices[i] = _Choice(None, None, f"step {record.step}: logprobs are not finite")
                else:
                    choices[i].record = record
        return choices

    def _choose(self, seqs: list[Sequence], rows: list[torch.Tensor]) -> list[_Choice]:
        choices: list[_Choice] = []
        banned = [banned_for_step(s.params, self.end_ids, len(s.output_ids)) for s in seqs]
        # Greedy rows (the common case) are chosen in one pass; sampled ones one by one.
        plain = [i for i, s in enumerate(seqs) if s.params.is_greedy and s.params.max_tokens]
        greedy = {}
        if plain:
            picks = greedy_tokens(torch.stack([rows[i] for i in plain]), [banned[i] for i in plain])
            greedy = dict(zip(plain, picks))
        for i, (seq, row) in enumerate(zip(seqs, rows)):
            step = len(seq.output_ids)
            if seq.params.max_tokens == 0:  # prompt scoring only
                choices.append(_Choice(None, None))
            elif i in greedy:
                token_id = greedy[i]
                choices.append(_Choice(token_id, None, None if token_id is not None else
                                       f"step {step}: no token can be chosen: every logit is NaN, -inf or banned"))
            else:
                try:
                    choices.append(_Choice(choose_token(row, seq.params, banned[i], seq.generator), None))
                except (SamplingError, RuntimeError) as e:  # this request fails; the batch goes on
                    choices.append(_Choice(None, None, f"step {step}: {e}"))
        return choices

    def _emit(self, seqs: list[Sequence], choices: list[_Choice], prompt_records: list) -> list[RequestOutput]:
        outputs = []
        for seq, choice, scored in zip(seqs, choices, prompt_records):
            if choice.error is not None:
                seq.error, seq.finish_reason = choice.error, "error"
                outputs.append(self._finish(seq, TextDelta()))
                continue
            if choice.token_id is None:  # max_tokens == 0
                seq.finish_reason = "length"
                out = self._finish(seq, TextDelta())
            elif choice.token_id in self.end_ids:  # the end of the turn is not part of the reply
                seq.finish_reason = "stop"
                out = self._finish(seq, TextDelta())
            else:
                out = self._advance(seq, choice)
            out.prompt_records = scored
            outputs.append(out)
        return outputs

    def _advance(self, seq: Sequence, choice: _Choice) -> RequestOutput:
        seq.append(choice.token_id)
        self._batch_tokens += 1
        delta = seq.text.add(choice.token_id, choice.record)
        if seq.text.is_stopped:
            seq.finish_reason = "stop"
        elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            # As vLLM counts it: prompt and reply together fill at most max_model_len positions.
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            return self._finish(seq, delta)
        return self._output(seq, delta)

    def _finish(self, seq: Sequence, delta: TextDelta) -> RequestOutput:
        tail = seq.text.finish() if seq.error is None else TextDelta()
        seq.status = Status.FINISHED
        del self._sequences[seq.request_id]
        return self._output(seq, TextDelta(delta.text + tail.text, delta.records + tail.records))

    def _output(self, seq: Sequence, delta: TextDelta) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id, text=delta.text, records=delta.records,
            num_prompt_tokens=len(seq.prompt_ids), num_output_tokens=len(seq.output_ids),
            finish_reason=seq.finish_reason, error=seq.error, num_kept_tokens=seq.text.num_kept_tokens,
        )

    def _report_retired(self, retired: list[Sequence]) -> list[RequestOutput]:
        outputs = []
        for seq in retired:
            if seq.is_aborted and seq.finish_reason is None:
                seq.finish_reason = "abort"
                self._sequences.pop(seq.request_id, None)
                outputs.append(self._output(seq, TextDelta()))
        return outputs

    # --- batch accounting --------------------------------------------------------------

    def _note_batch(self, num_running: int) -> None:
        if self._batch_start is None:
            self._batch_start = time.perf_counter()
        self._batch_max = max(self._batch_max, num_running)

    def take_batch_summary(self) -> BatchSummary | None:
        """Once the engine is idle: the busy period that just ended (then forgotten)."""
        if self.has_work() or self._batch_start is None:
            return None
        summary = BatchSummary(self._batch_max, time.perf_counter() - self._batch_start, self._batch_tokens)
        self._batch_start, self._batch_max, self._batch_tokens = None, 0, 0
        return summary

    # --- conveniences for the CLI and tests ---------------------------------------------

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.chat_template.render(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_bos=self.tokenizer.ids.add_bos)

    def generate(self, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
        """Run requests to completion together; every delta each one produced, in order."""
        for request_id, (prompt_ids, params) in requests.items():
            self.add_request(request_id, prompt_ids, params)
        deltas: dict[str, list[RequestOutput]] = {request_id: [] for request_id in requests}
        while self.has_work():
            for out in self.step():
                deltas[out.request_id].append(out)
        self.take_batch_summary()
        return deltas

    def info(self) -> dict:
        """Everything that shapes the numbers, for /v1/server_info and bench reports."""
        return {
            "model_path": str(self.model_path),
            "model_sha256": self.model_sha256,
            "architecture": self.spec.arch,
            "device": str(self.device),
            "dtype": self.config.dtype,
            "max_batch": self.config.max_batch,
            "batch_window_ms": self.config.batch_window_ms,
            "max_model_len": self.max_model_len,
            "max_prefill_tokens": self.config.max_prefill_tokens,
            "batch_invariant": self.config.is_batch_invariant,
            "decode_path": self.model.decode_path,
            "num_threads": self.num_threads,
            "torch_version": torch.__version__,
        }
