"""The engine: owns the model and the KV cache, and advances every live request one token per step."""

import dataclasses
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.cache.manager import CacheManager
from batchproof.engine.cache.prefix_cache import PrefixCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.draft.cost import StepCost
from batchproof.engine.draft.drafter import Drafter
from batchproof.engine.grammar.state import GrammarState
from batchproof.engine.memory import hand_back_large_blocks, prefill_heap, trim_heap
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.front import ModelFront
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.model.moe.receipt import receipt, replay_error
from batchproof.engine.model.ops import KernelOps, Ops, choose_ops, kernels
from batchproof.engine.model.ops.threads import ThreadShare, read_machine
from batchproof.engine.model.source import model_source, pinned_files
from batchproof.engine.model.spec import ModelSpec
from batchproof.engine.model.transformer import Transformer
from batchproof.engine.outputs import OutputProcessor, RequestOutput
from batchproof.engine.runner import ModelRunner
from batchproof.engine.sampling.draws import Draws
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.sampling.sampler import logit_bias_row
from batchproof.engine.scheduler import ScheduledStep, Scheduler
from batchproof.engine.sequence import Sequence
from batchproof.engine.speculative.propose import propose
from batchproof.engine.speculative.verify import verify
from batchproof.engine.text.text_stream import TextStream
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.engine.weight_versions import default_version, first_mark, label, mark_version

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PREFIX_BLOCK_TOKENS = 16  # vLLM's default block: fine enough that a shared system prompt loses < 16 tokens


@dataclass
class BatchSummary:
    """One busy period of the engine, from the first admission until it went idle."""

    max_batch_size: int  # the most sequences decoded together in one step
    duration_s: float
    num_tokens: int
    # Speculative decoding, per request that ended in it and had drafts: (request id, tokens
    # drafted, of those emitted).
    drafts: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class PreparedWeights:
    """A model read and built off the engine thread, waiting to be installed."""

    path: Path
    sha256: str
    model: Transformer
    load_s: float  # reading the files and building the weights


def _check_same_spec(served: ModelSpec, new: ModelSpec, path: Path) -> None:
    """Every hyperparameter equal: the KV cache, the tokenizer and the kernels' shapes stay."""
    for f in dataclasses.fields(ModelSpec):
        if getattr(served, f.name) != getattr(new, f.name):
            raise ModelLoadError(f"{path}: its {f.name} is {getattr(new, f.name)!r}, the served model's is "
                                 f"{getattr(served, f.name)!r} (load_weights takes the same architecture and shapes)")


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
        hand_back_large_blocks()
        self.model_path = resolve_model(config.model_path)
        ops = choose_ops(self.device, self.dtype, config.is_batch_invariant, self.num_threads, config.numerics,
                         config.max_isa)
        # Native weights need our kernels; the torch backend (a GPU, no compiler, or
        # invariance off) multiplies float tensors, so it always gets them dequantized.
        self.weights = config.weights if isinstance(ops, KernelOps) else "float32"
        # Unless --num-threads fixed it, each step of our kernels uses the cores no other process
        # is using (threads.py): their bits never depend on the count, a BLAS's may.
        self.threads = ThreadShare(self.num_threads,
                                   read=read_machine if isinstance(ops, KernelOps) and not config.num_threads else None)
        source = model_source(self.model_path)  # the format, decided once
        model_file = source.read(self._runs_natively)
        self.spec: ModelSpec = model_file.spec
        # The model's facts, held once: the tokenizer, chat format and context length are read from it.
        self.front = ModelFront.from_text(model_file.path, source.text(model_file), config)
        with torch.inference_mode():
            model = Transformer.from_model_file(model_file, self.device, self.dtype, self.max_model_len, ops)
        del model_file
        trim_heap()  # what building the tokenizer and reading the file dropped
        s = self.spec
        kv = KVCache(s.num_layers, config.max_batch, s.num_kv_heads, self.max_model_len, s.head_dim,
                     self.device, self.dtype)
        self.model_sha256 = source.sha256()
        # The label each reply's tokens carry (docs/weight-versions.md); load_weights sets it.
        self.weight_version = default_version(self.model_sha256)
        self.weights_loaded_at = time.time()
        # The one owner of the slots and the prefix cache: the scheduler takes and gives back
        # slots through it, the runner asks it around each prompt's prefill.
        self.caches = CacheManager(kv, self._prefix_cache(ops))
        # The model, held once: the runner's (a swap replaces it there).
        self.runner = ModelRunner(model, self.caches, config.max_batch, config.max_prefill_tokens)
        self.scheduler = Scheduler(self.caches, config.max_prefill_tokens, config.prefill_share)
        self.end_ids = self.tokenizer.ids.end_of_turn_ids
        self.load_time_s = time.perf_counter() - started
        self._sequences: dict[str, Sequence] = {}  # the live requests: added and forgotten here only
        self._batch_start: float | None = None
        self._batch_max = 0
        self._batch_drafts: list[tuple[str, int, int]] = []
        self._stepping: list[Sequence] = []  # whom the current step runs (fail_step ends them)
        # What a decode step of n rows costs here, timed as it runs: which drafts pay (speculative/).
        self.step_cost = StepCost()
        self._drafting_s = 0.0
        self.outputs = OutputProcessor(self.end_ids, self.max_model_len, self.model.ops.normalizer_and_top_k,
                                       self.model.ops.first_max, self.model.ops.sample, config.grammar_mask_timeout_s)

    @property
    def _runs_natively(self):
        return kernels.runs_natively if self.weights == "native" else None

    # --- weights replaced in place (POST /v1/load_weights) -----------------------------

    def prepare_weights(self, path: Path) -> "PreparedWeights":
        """The model at `path` (a checkpoint directory or GGUF of exactly this model's spec) read
        and built beside the one serving, on any thread: nothing the engine runs is touched.
        ModelLoadError (one line naming the path) if it cannot replace the served weights;
        OSError if one of its files cannot be opened."""
        started = time.perf_counter()
        path = Path(path)
        # Checked, read and built first, then hashed from the same open files: the sha256 names
        # the bytes served, and a file that is not this model is never read whole.
        source = model_source(path)
        with pinned_files(source) as files_sha256:
            model_file = source.read(self._runs_natively)
            _check_same_spec(self.spec, model_file.spec, path)
            with torch.inference_mode():
                model = Transformer.from_model_file(model_file, self.device, self.dtype, self.max_model_len,
                                                    self.model.ops)
            del model_file
            sha256 = files_sha256()
        return PreparedWeights(path, sha256, model, time.perf_counter() - started)

    def install_weights(self, prepared: "PreparedWeights", version: str | None = None, keep: bool = False) -> int:
        """Serve `prepared` from the next step on, labelled `version` (default: its hash's).
        Between requests (the async engine drains first), or with `keep` mid-generation: every
        sequence then feeds its whole prefix again under the new weights before its next token,
        so no sequence's keys mix two models. The prefix cache is emptied with it (a new cache:
        its identity names the new weights). -> how many sequences compute their prefix again."""
        if self.has_work() and not keep:
            raise RuntimeError("weights are replaced only while no sequence runs or waits")
        # The fused kernel's description is keyed by the weights' identity (never an address a
        # freed model can pass on): the next decode step describes the new ones.
        self.runner.model = prepared.model
        self.model_path, self.model_sha256 = prepared.path, prepared.sha256
        self.weight_version = version or default_version(prepared.sha256)
        self.weights_loaded_at = time.time()
        self.caches.prefix_cache = self._prefix_cache(self.model.ops)
        # Ended ones still holding a slot too: their old keys must not reach the new cache.
        live = {id(s): s for s in [*self.scheduler.running, *self._sequences.values()]}.values()
        return sum(self._refeed(seq) for seq in live)

    def _refeed(self, seq: Sequence) -> bool:
        """The weights under `seq` changed mid-generation (a keep swap): whatever its slot holds
        was computed by the old ones. A sequence still going on feeds its whole prefix again (a
        prompt part-way through prefill starts over, as if it arrived now; one with a reply so
        far refills it), its next tokens marked with the new version; one that has ended,
        awaiting retirement, keeps nothing, so no old key reaches the new weights' prefix cache.
        True if it computes again something it had computed."""
        had_computed = seq.num_computed > 0
        going = not (seq.is_finished or seq.is_aborted)
        refill = going and bool(seq.output_ids)
        self.caches.drop_reused(seq)  # copied from the old weights' cache: its prefill asks the new one
        self.runner.restart(seq, refill)
        if going:
            mark_version(seq, self.weight_version)
        return going and (had_computed or refill)

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The cache manager's (its counters and bytes go to /metrics)."""
        return self.caches.prefix_cache

    @property
    def model(self) -> Transformer:
        return self.runner.model

    def _prefix_cache(self, ops: Ops) -> PrefixCache | None:
        """Only where a position's bits cannot depend on who computed it (our kernels)."""
        if not self.config.prefix_cache or not ops.reuses_prefixes:
            return None
        # The key's seed names everything that shapes the bits: model file, weights, kernels.
        identity = f"{self.model_sha256}|{self.weights}|{self.config.dtype}|{ops.numerics}"
        return PrefixCache(PREFIX_BLOCK_TOKENS, self.config.prefix_cache_mb * 2**20, identity)

    # --- requests --------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; a ValueError names what cannot run (the server checks these first)."""
        self.check_request(request_id, prompt_ids, params)
        if params.seed is not None:
            draws = Draws(params.seed)
        elif not params.is_greedy:
            draws = Draws(secrets.randbits(63))
        else:
            draws = None
        prompt_ids = list(prompt_ids)
        seq = Sequence(
            request_id, prompt_ids, params, TextStream(self.tokenizer, params.stop), draws,
            logit_bias=logit_bias_row(params.logit_bias, self.tokenizer.vocab_size),
            drafter=(Drafter(prompt_ids, self.config.max_draft_tokens, self.step_cost)
                     if self.is_speculative and params.max_tokens > 1 else None),
            # (scoring alone chooses no token, so it needs no matcher)
            grammar=(GrammarState(self.tokenizer, params.constraint.grammar)
                     if params.constraint is not None and params.max_tokens else None),
            weight_versions=first_mark(self.weight_version))
        self._sequences[request_id] = seq
        self.scheduler.add(seq)

    def check_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        """The refusals a new request meets (ValueError): its id in use, an empty or too long
        prompt, a token id outside the vocabulary (replay.py asks them of a receipt too)."""
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
        if (params.return_routed_experts or params.forced_routes is not None) and not self.spec.num_experts:
            raise ValueError(f"return_routed_experts: this {self.spec.arch} model has no mixture-of-experts layers")
        wrong = params.forced_routes is not None and replay_error(
            params.forced_routes, self.spec.num_experts, len(self.model.moe_index), self.spec.num_experts_used,
            len(prompt_ids))
        if wrong:
            raise ValueError(f"forced_routes: {wrong}")

    def abort(self, request_id: str) -> None:
        seq = self._sequences.get(request_id)
        if seq is not None and not seq.is_finished:
            seq.is_aborted = True
            if seq.grammar is not None:  # a compile or mask no worker has begun is dropped
                seq.grammar.cancel()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reap(self) -> list[RequestOutput]:
        """The aborted requests' last outputs now, without a step (none runs while paused in
        keep mode); their slots are given back as a step's schedule would."""
        return self._forget_finished(self.outputs.retired(self.scheduler.retire()))

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_free_slots(self) -> int:
        return self.caches.num_free_slots

    # --- the step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()  # retired slots emptied and given back, newcomers given theirs
        self._start_grammars(self.scheduler.running)
        outputs = self.outputs.retired(scheduled.retired)
        self._stepping = scheduled.prefill or scheduled.decode
        if self._stepping:
            self.share_cores()
            self._note_batch(len(scheduled.decode))
            started = time.perf_counter()
            seqs, logits, prompt_records, drafts = self._forward(scheduled)
            self.scheduler.observe(scheduled, time.perf_counter() - started)
            if any(drafts):  # each sequence's rows read in order, as far as its draft holds
                verified = verify(self.outputs, seqs, drafts, logits)
                self.runner.accept(seqs, verified.num_computed)
                outputs += verified.outputs
            elif seqs:  # a prefill step that completed no prompt chooses nothing
                outputs += self.outputs.process(seqs, logits, prompt_records)
            if scheduled.decode:  # what its rows cost, choosing their tokens included, drafting not
                self.step_cost.observe(len(seqs) + sum(map(len, drafts)),
                                       time.perf_counter() - started - self._drafting_s)
        self._stepping = []
        return self._forget_finished(outputs)

    def share_cores(self) -> None:
        """The step's thread count: the cores free now (threads.py). No count changes a bit."""
        num_threads = self.threads.now()
        if num_threads != self.model.ops.num_threads:
            self.model.ops.num_threads = num_threads
            torch.set_num_threads(num_threads)

    @staticmethod
    def _start_grammars(running: list[Sequence]) -> None:
        """Admitted sequences' matchers start (a copy of the compiled grammar, its first mask) on
        the grammar workers while their prompts are fed; waiting ones hold none."""
        for seq in running:
            if seq.grammar is not None:
                seq.grammar.start()

    def fail_step(self, message: str) -> list[RequestOutput]:
        """After step() raised: its sequences end with an error and give their slots back at
        the next step; those still waiting are untouched. A step that failed before choosing
        whom to run leaves every running sequence in an unknown state: they all fail."""
        failed = self._stepping or list(self.scheduler.running)
        self._stepping = []
        for seq in failed:  # its keys and values may be half written
            self.runner.discard(seq)
        return self._forget_finished([self.outputs.fail(seq, message) for seq in failed])

    def _forget_finished(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The one place a live request leaves `_sequences`: its final output (a finish_reason).
        Every output passes here, and is stamped with the weight versions of its tokens."""
        for out in outputs:
            seq = self._sequences.get(out.request_id)
            if seq is not None:
                label(out, seq)
            if out.finish_reason is not None:
                if seq is not None and seq.routes is not None:  # every fed position's (the last chosen never was)
                    out.routed_experts = receipt(seq.routes, seq.num_tokens - 1, self.spec.num_experts)
                self._sequences.pop(out.request_id, None)
                if out.num_draft_tokens:
                    self._batch_drafts.append((out.request_id, out.num_draft_tokens, out.num_accepted_tokens))
        return outputs

    def _forward(self, scheduled: ScheduledStep) -> tuple[list[Sequence], torch.Tensor, list, list[list[int]]]:
        """The sequences whose next token this step chooses (every decoding one, or the prompts
        the prefill completed), their logits [rows, V], prompt records and drafts (a decode
        step's: one row per sequence, and one more per drafted token)."""
        if scheduled.decode:
            decode = scheduled.decode
            started = time.perf_counter()
            drafts = propose(decode, self.max_model_len, self.step_cost)
            self._drafting_s = time.perf_counter() - started  # (a grammar's forced tokens may be waited for)
            logits = self.runner.decode(decode, drafts) if any(drafts) else self.runner.decode(decode)
            return decode, logits, [None] * len(decode), drafts
        with prefill_heap():
            done = self.runner.prefill(scheduled.prefill, scheduled.prefill_tokens)
        if not done:
            return [], torch.empty(0), [], []
        seqs, logits, records = zip(*done)
        return list(seqs), torch.stack(logits), list(records), []

    @property
    def is_speculative(self) -> bool:
        """Only where a row's bits do not depend on the rows beside it nor on whether a prompt
        or a decode step computed its keys (our kernels): the torch path pads a step to a fixed
        row count, which extra rows would overrun."""
        return self.config.speculative and self.model.ops.reuses_prefixes

    # --- batch accounting --------------------------------------------------------------

    def _note_batch(self, num_decoding: int) -> None:
        """m counts sequences decoded together: a step that only prefills (a burst of
        max_tokens 1 requests) starts a busy period but batches nobody's decode."""
        if self._batch_start is None:
            self._batch_start = time.perf_counter()
        self._batch_max = max(self._batch_max, num_decoding)

    def take_batch_summary(self) -> BatchSummary | None:
        """Once the engine is idle: the busy period that just ended (then forgotten)."""
        if self.has_work() or self._batch_start is None:
            return None
        summary = BatchSummary(self._batch_max, time.perf_counter() - self._batch_start,
                               self.outputs.take_num_tokens(), self._batch_drafts)
        self._batch_start, self._batch_max, self._batch_drafts = None, 0, []
        return summary

    @property
    def tokenizer(self) -> Tokenizer:
        return self.front.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.front.max_model_len

    # --- conveniences for the CLI and tests ---------------------------------------------

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.front.chat_prompt_ids(messages, tools)

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

    def prefix_cache_info(self) -> dict:
        if self.prefix_cache is None:
            reason = ("off (--no-prefix-cache)" if not self.config.prefix_cache
                      else "off: this decode path cannot promise the same bits from reused keys")
            return {"enabled": False, "reason": reason}
        return {"enabled": True, **self.prefix_cache.info()}

    def speculative_info(self) -> dict:
        if not self.is_speculative:
            reason = ("off (--no-speculative)" if not self.config.speculative
                      else "off: this decode path pads a step to a fixed row count, which drafted rows would overrun")
            return {"enabled": False, "reason": reason}
        return {"enabled": True, "drafting": "prompt lookup", "max_draft_tokens": self.config.max_draft_tokens}

    def info(self) -> dict:
        """Everything that shapes the numbers, for /v1/server_info and bench reports."""
        return {
            "model_path": str(self.model_path),
            "model_sha256": self.model_sha256,
            "architecture": self.spec.arch,
            "num_experts": self.spec.num_experts,  # 0: dense (no routing receipts)
            "num_experts_used": self.spec.num_experts_used,
            "num_moe_layers": len(self.model.moe_index),
            "device": str(self.device),
            "dtype": self.config.dtype,
            "max_batch": self.config.max_batch,
            "batch_window_ms": self.config.batch_window_ms,
            "max_model_len": self.max_model_len,
            "max_prefill_tokens": self.config.max_prefill_tokens,
            "prefill_share": self.config.prefill_share,
            "batch_invariant": self.config.is_batch_invariant,
            "decode_path": self.model.ops.decode_path,
            "numerics": self.model.ops.numerics,
            "chat_template": self.front.chat_template_origin,
            "weights": self.weights,
            "weights_bytes": self.model.weights_nbytes,
            "prefix_cache": self.prefix_cache_info(),
            "speculative": self.speculative_info(),
            "num_threads": self.num_threads,
            "torch_version": torch.__version__,
        }
