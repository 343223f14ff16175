"""The engine's settings: what shapes the numbers (no torch here, so the CLI builds flags from it)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from batchproof.common.config import require

# --max-isa's names, each a cap on the kernels' level (kernels.ISA_LEVELS).
MaxIsa = Literal["auto", "avx512", "avx2", "neon", "portable"]


@dataclass(frozen=True)
class EngineConfig:
    """What shapes the numbers: the model, the device, the batch and its invariance."""

    model_path: Path | None = field(
        default=None, metadata={"help": "GGUF file, Hugging Face checkpoint directory (config.json, safetensors, "
                                        "tokenizer.json), or the name of a packaged model (`batchproof models`; "
                                        "default: smollm2-135m)"}
    )
    chat_template: Path | None = field(
        default=None, metadata={"help": "Jinja2 chat template file, used instead of the model's own or a built-in one"}
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto"})
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata={"help": "compute dtype of weights and activations"}
    )
    max_batch: int = field(default=16, metadata={"help": "most sequences decoded together"})
    batch_window_ms: float = field(
        default=20.0, metadata={"help": "how long an idle engine waits for more arrivals before it starts"}
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "context per sequence (default: the model's, at most 8192)"}
    )
    is_batch_invariant: bool = field(
        default=True,
        metadata={"help": "bitwise the same tokens and logprobs at any batch size (off: faster torch path)"},
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "CPU threads, fixed (default: all cores, fewer while other processes use "
                                        "some: engine/model/ops/threads.py)"}
    )
    max_prefill_tokens: int = field(
        default=2048, metadata={"help": "prompt tokens prefilled in one step when nothing else is decoding"}
    )
    prefill_share: float = field(
        default=0.5, metadata={"help": "while others decode, a prefill step takes at most this fraction of a "
                                       "decode step's time (steps alternate): running streams' per-token latency "
                                       "grows by at most this much while prompts are fed; more gives newcomers "
                                       "their first token sooner"}
    )
    weights: Literal["native", "float32"] = field(
        default="native",
        metadata={"help": "native: matmul weights stay in their GGUF blocks (our kernels dequantize as they "
                          "multiply, bitwise the float32 result); float32: dequantized at load"},
    )
    numerics: Literal["float32", "int8"] = field(
        default="float32",
        metadata={"help": "float32: every weight the float gguf.quants gives, times float32 activations (exact: "
                          "re-scoring against a float trainer matches); int8: each activation row quantized to "
                          "int8 per block of 32, integer dots with the weights' own quants (faster, an "
                          "approximation; equally batch-invariant; its own numerics_id). int8 needs native "
                          "weights on our CPU kernels"},
    )
    max_isa: MaxIsa = field(
        default="auto",
        metadata={"help": "the highest instruction set our CPU kernels use (auto: the best this CPU has): every "
                          "level gives the same bits, so this changes speed only; to measure what a CPU with "
                          "less runs, or to show replicas on different levels agree. A cap, never a demand: a "
                          "level this CPU lacks runs its best below it (avx2 and neon are each architecture's "
                          "first vector level, so neon on x86 runs AVX2, avx2 or avx512 on ARM runs NEON)"},
    )
    prefix_cache: bool = field(
        default=True,
        metadata={"help": "reuse the keys and values of prompt prefixes already computed (bitwise the same "
                          "results; only where the kernels make it exact)"},
    )
    # A mask's own work is bounded by llguidance's limits (milliseconds); what can take seconds is
    # a first mask that compiles (an engine used without the server's check) and builds the
    # tokenizer's grammar view (~2 s at 262,144 tokens, once): 10 s leaves that room on a busy machine.
    grammar_mask_timeout_s: float = field(
        default=10.0,
        metadata={"help": "longest a step waits for its constrained rows' next masks (a row's first includes "
                          "copying or compiling its grammar); past it only the rows still waiting fail (error "
                          "code grammar_timeout)"},
    )
    speculative: bool = field(
        default=True,
        metadata={"help": "speculative decoding: tokens drafted from the prompt and reply (prompt lookup, no draft "
                          "model) and verified as extra rows of a decode step; bitwise the same tokens and logprobs "
                          "(only where the kernels make it exact)"},
    )
    max_draft_tokens: int = field(
        default=15, metadata={"help": "most tokens drafted for one sequence in one step (speculative decoding; "
                                      "each sequence drafts 1, 3, 7 or this many, as its acceptance pays for)"}
    )
    prefix_cache_mb: int = field(
        default=128,
        metadata={"help": "memory, in MiB, that the prefix cache and the running sequences' keys and values share: "
                          "cached blocks make way as running sequences grow, down to a quarter of it"},
    )

    def __post_init__(self) -> None:
        require(self.numerics == "float32" or self.weights == "native",
                f"numerics int8 multiplies the weights' own quants: it needs weights native, got {self.weights}")
        require(self.max_isa in get_args(MaxIsa),
                f"max_isa must be one of {', '.join(get_args(MaxIsa))}, got {self.max_isa!r}")
        require(self.max_batch >= 1, f"max_batch must be >= 1, got {self.max_batch}")
        require(self.batch_window_ms >= 0, f"batch_window_ms must be >= 0, got {self.batch_window_ms}")
        require(
            self.max_model_len is None or self.max_model_len >= 16,
            f"max_model_len must be >= 16, got {self.max_model_len}",
        )
        require(
            self.num_threads is None or self.num_threads >= 1,
            f"num_threads must be >= 1, got {self.num_threads}",
        )
        require(self.max_draft_tokens >= 1, f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        require(self.prefix_cache_mb >= 0, f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        require(self.grammar_mask_timeout_s > 0,
                f"grammar_mask_timeout_s must be > 0, got {self.grammar_mask_timeout_s}")
        require(self.prefill_share > 0, f"prefill_share must be > 0, got {self.prefill_share}")
        require(self.max_prefill_tokens >= 1, f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}",
        )
