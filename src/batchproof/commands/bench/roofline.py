"""The roofline beside the speed figures: how many bytes a decode step reads and how many
operations a token costs, so a rate reads as GB/s (a single stream is bound by memory) and
GFLOPS or integer GOPS (16 streams are bound by arithmetic), each as a share of this machine's
own limit, measured in the same run: the read bandwidth, the float32 FMA peak, and the int8
numerics' integer-dot peak.

The model's figures come from the loaded engine (torch is imported only through it)."""

import time
from dataclasses import dataclass

PEAK_SECONDS = 0.5  # per measurement of a peak (the best of three is kept)
# A plain sum over 1 GiB, the best of three: far beyond any cache a small server has, so every
# byte comes from memory, as a large model's weights do each step.
BANDWIDTH_BYTES = 1 << 30
BANDWIDTH_RUNS = 3


@dataclass
class Footprint:
    """One decode step's reads at c=1 and one token's arithmetic, at a context of `context` tokens."""

    # every matmul weight once (the embedding: one row, unless it is the LM head; an MoE layer: its
    # router and as many experts as a token uses)
    weight_bytes_per_step: int
    kv_bytes_per_step: int  # keys and values of `context` positions, every layer
    flops_per_token: int  # 2 per multiply-add: the matmuls, the LM head, attention over `context`
    context: int
    # Of flops_per_token, the matmuls over weights kept in their GGUF blocks: integer dots in the
    # int8 numerics, float FMAs in float32.
    block_ops_per_token: int = 0

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes_per_step + self.kv_bytes_per_step


@dataclass
class Limits:
    """This machine's limits on the engine's threads, measured in this run."""

    read_gb_s: float
    fma_peak_gflops: float
    int_dot_peak_gops: float


@dataclass
class Roofline:
    footprint: Footprint
    limits: Limits
    numerics: str = "float32"  # the engine's: which peak bounds its matmuls at c=16
    c1_tok_s: float | None = None
    c16_aggregate_tok_s: float | None = None

    def __post_init__(self) -> None:
        if self.numerics not in ("float32", "int8"):
            raise ValueError(f"Roofline numerics must be 'float32' or 'int8' (EngineConfig's), not {self.numerics!r}")

    @property
    def c1_gb_s(self) -> float | None:
        return None if self.c1_tok_s is None else self.footprint.bytes_per_step * self.c1_tok_s / 1e9

    @property
    def c1_share(self) -> float | None:
        """c=1's bytes a second over the read bandwidth."""
        return None if self.c1_gb_s is None else self.c1_gb_s / self.limits.read_gb_s

    @property
    def c16_gflops(self) -> float | None:
        """Every operation of a token at c=16's rate (in int8, integer dots included)."""
        if self.c16_aggregate_tok_s is None:
            return None
        return self.footprint.flops_per_token * self.c16_aggregate_tok_s / 1e9

    @property
    def c16_int_gops(self) -> float | None:
        """In the int8 numerics, the block matmuls' integer operations at c=16's rate."""
        if self.c16_aggregate_tok_s is None or self.numerics != "int8":
            return None
        return self.footprint.block_ops_per_token * self.c16_aggregate_tok_s / 1e9

    @property
    def c16_share(self) -> float | None:
        """c=16 against its limit: float32, every operation over the FMA peak; int8, the block
        matmuls' integer operations over the int-dot peak (the rest, attention and any float
        weight, is float and small beside them)."""
        if self.c16_int_gops is not None:
            return self.c16_int_gops / self.limits.int_dot_peak_gops
        return None if self.c16_gflops is None else self.c16_gflops / self.limits.fma_peak_gflops

    def lines(self) -> list[str]:
        f, limits = self.footprint, self.limits
        lines = [f"roofline: a decode step reads {f.bytes_per_step / 1e6:.1f} MB (weights "
                 f"{f.weight_bytes_per_step / 1e6:.1f}, KV at {f.context} tokens {f.kv_bytes_per_step / 1e6:.1f}); "
                 f"a token costs {f.flops_per_token / 1e6:.0f} MFLOP ({f.block_ops_per_token / 1e6:.0f} in block "
                 f"matmuls); this machine reads {limits.read_gb_s:.1f} GB/s, FMA peak "
                 f"{limits.fma_peak_gflops:.1f} GFLOPS, int-dot peak {limits.int_dot_peak_gops:.1f} GOPS"]
        if self.c1_gb_s is not None:
            lines.append(f"roofline c=1: {self.c1_tok_s:.1f} tok/s x {f.bytes_per_step / 1e6:.1f} MB "
                         f"= {self.c1_gb_s:.2f} GB/s, {self.c1_share:.0%} of the read bandwidth")
        if self.c16_int_gops is not None:
            lines.append(f"roofline c=16 (int8): {self.c16_aggregate_tok_s:.1f} tok/s x "
                         f"{f.block_ops_per_token / 1e6:.0f} M integer ops = {self.c16_int_gops:.1f} GOPS, "
                         f"{self.c16_share:.0%} of the int-dot peak")
        elif self.c16_gflops is not None:
            lines.append(f"roofline c=16: {self.c16_aggregate_tok_s:.1f} tok/s x {f.flops_per_token / 1e6:.0f} MFLOP "
                         f"= {self.c16_gflops:.1f} GFLOPS, {self.c16_share:.0%} of the FMA peak")
        return lines

    def as_json(self) -> dict:
        f, limits = self.footprint, self.limits

        def rounded(x: float | None, digits: int) -> float | None:
            return None if x is None else round(x, digits)

        return {"bytes_per_step": f.bytes_per_step, "weight_bytes_per_step": f.weight_bytes_per_step,
                "kv_bytes_per_step": f.kv_bytes_per_step, "flops_per_token": f.flops_per_token,
                "block_ops_per_token": f.block_ops_per_token, "context": f.context, "numerics": self.numerics,
                "read_gb_s": round(limits.read_gb_s, 2), "fma_peak_gflops": round(limits.fma_peak_gflops, 2),
                "int_dot_peak_gops": round(limits.int_dot_peak_gops, 2),
                "c1_gb_s": rounded(self.c1_gb_s, 3), "c1_share_of_read": rounded(self.c1_share, 4),
                "c16_gflops": rounded(self.c16_gflops, 2), "c16_int_gops": rounded(self.c16_int_gops, 2),
                "c16_share_of_peak": rounded(self.c16_share, 4)}


def _shape_and_bytes(weight) -> tuple[tuple[int, int], int]:
    if hasattr(weight, "parts"):  # kept in its GGUF blocks
        return weight.shape, weight.nbytes
    return tuple(weight.shape), weight.numel() * weight.element_size()


def _experts_per_token(moe, used: int) -> tuple[int, int, int]:
    """An MoE layer's (bytes, multiply-adds, of them in GGUF blocks) for one token: the router
    (float, every expert's row) and `used` experts' gate/up and down. The experts of a layer are
    one size (one stacked tensor each in a GGUF), so `used` of them weigh used / experts of all."""
    (n, k), nbytes = _shape_and_bytes(moe.router)
    experts = [_shape_and_bytes(w) for w in (*moe.gate_up, *moe.down)]
    expert_bytes = sum(b for _, b in experts)
    expert_macs = sum(n_ * k_ for (n_, k_), _ in experts)
    is_block = all(hasattr(w, "parts") for w in (*moe.gate_up, *moe.down))
    share = used * expert_macs // len(moe.gate_up)
    return nbytes + used * expert_bytes // len(moe.gate_up), n * k + share, share if is_block else 0


def footprint(engine, context: int) -> Footprint:
    """What one decode step of `engine`'s model reads and computes at `context` tokens."""
    model, spec = engine.model, engine.spec
    weights = [w for layer in model.layers
               for w in (layer.wqkv, layer.wo, *((layer.w_gate_up, layer.w_down) if layer.moe is None else ()))]
    weight_bytes = macs = block_macs = 0
    for weight in [*weights, model.lm_head]:
        (n, k), nbytes = _shape_and_bytes(weight)
        weight_bytes, macs = weight_bytes + nbytes, macs + n * k
        block_macs += n * k if hasattr(weight, "parts") else 0
    for moe in (layer.moe for layer in model.layers if layer.moe is not None):
        nbytes, expert_macs, expert_block_macs = _experts_per_token(moe, spec.num_experts_used)
        weight_bytes, macs, block_macs = weight_bytes + nbytes, macs + expert_macs, block_macs + expert_block_macs
    vocab = model.lm_head.shape[0]
    if model.embed is not model.lm_head:
        weight_bytes += _shape_and_bytes(model.embed)[1] // vocab  # the one row looked up
    attended = [min(context, spec.window(i) or context) for i in range(spec.num_layers)]
    kv_bytes = sum(2 * spec.num_kv_heads * spec.head_dim * 4 * n for n in attended)
    attention_macs = sum(2 * spec.num_heads * spec.head_dim * n for n in attended)  # q.k and p.v
    return Footprint(weight_bytes, kv_bytes, 2 * (macs + attention_macs), context, 2 * block_macs)


def _best_rate(measure, runs: int = 3) -> float:
    """The best of `runs` calls of `measure` (it returns operations done), in G a second."""
    best = 0.0
    for _ in range(runs):
        started = time.perf_counter()
        done = measure()
        best = max(best, done / (time.perf_counter() - started) / 1e9)
    return best


def fma_peak_gflops(num_threads: int, seconds: float = PEAK_SECONDS) -> float:
    """This machine's float32 FMA peak on `num_threads` threads: the kernels' plain FMA loop
    (independent accumulators, no memory traffic), the best of three runs."""
    from batchproof.engine.model.ops import kernels

    return _best_rate(lambda: kernels.fma_peak(seconds, num_threads))


def int_dot_peak_gops(num_threads: int, seconds: float = PEAK_SECONDS) -> float:
    """Likewise for the int8 numerics' integer dot, as its tiles spell it at the level in use
    (AVX-512 VNNI's vpdpbusd, AVX2's maddubs + madd, or plain C)."""
    from batchproof.engine.model.ops import kernels

    return _best_rate(lambda: kernels.int_dot_peak(seconds, num_threads))


def read_gb_s(num_threads: int, num_bytes: int = BANDWIDTH_BYTES, runs: int = BANDWIDTH_RUNS) -> float:
    """This machine's read bandwidth on `num_threads` threads: the best of `runs` sums over
    `num_bytes` (the kernels time each sum themselves, so the buffer's first writing is not counted)."""
    from batchproof.engine.model.ops import kernels

    if num_bytes < 8 or runs < 1:
        raise ValueError(f"read_gb_s needs num_bytes >= 8 and runs >= 1, not num_bytes={num_bytes}, runs={runs}")
    rate = kernels.read_bandwidth(num_bytes, num_threads, runs)
    if rate <= 0:
        raise RuntimeError(f"the read bandwidth needs a {num_bytes >> 20} MiB buffer, and none could be allocated")
    return rate / 1e9


def limits(num_threads: int) -> Limits:
    return Limits(read_gb_s(num_threads), fma_peak_gflops(num_threads), int_dot_peak_gops(num_threads))
