"""Prometheus metrics on a registry of the app's own (no process-global state)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# One bucket per batch size up to the default max batch, so the probe can read the
# largest m of a band exactly from two scrapes.
BATCH_SIZE_BUCKETS = (*range(1, 17), 24, 32, 48, 64, 128)
ACCEPTANCE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("batchproof_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("batchproof_prompt_tokens", "prompt tokens processed", registry=r)
        self.completion_tokens = Counter("batchproof_completion_tokens", "tokens generated", registry=r)
        self.queue_depth = Gauge("batchproof_queue_depth", "requests waiting for a batch slot", registry=r)
        self.running = Gauge("batchproof_running_requests", "requests holding a batch slot", registry=r)
        self.free_slots = Gauge("batchproof_free_slots", "batch slots (and their KV memory) free", registry=r)
        self.ttft = Histogram("batchproof_time_to_first_token_seconds", "arrival to first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.token_latency = Histogram("batchproof_time_per_output_token_seconds",
                                       "time between consecutive generated tokens of a request",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.prefix_cache = PrefixCacheCollector()
        r.register(self.prefix_cache)
        self.batch_size = Histogram("batchproof_batch_size",
                                    "per completed batch: the most sequences decoded together",
                                    buckets=BATCH_SIZE_BUCKETS, registry=r)

        # Speculative decoding, counted as each request ends (per request: the histogram of the
        # share of its drafted tokens it emitted; the log line names each request's counts).
        self.draft_tokens = Counter("batchproof_speculative_draft_tokens", "tokens drafted for verification",
                                    registry=r)
        self.accepted_tokens = Counter("batchproof_speculative_accepted_tokens",
                                       "drafted tokens verified and emitted", registry=r)
        self.acceptance = Histogram("batchproof_speculative_acceptance_ratio",
                                    "per request with drafts: accepted / drafted tokens", buckets=ACCEPTANCE_BUCKETS,
                                    registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PrefixCacheCollector:
    """The engine's prefix-cache counters, read at each scrape (the engine owns them)."""

    def __init__(self) -> None:
        self.cache = None  # the engine's PrefixCache, once loaded (None: off or loading)

    def collect(self):
        cache = self.cache
        if cache is None:
            return
        stats = cache.stats
        yield CounterMetricFamily("batchproof_prefix_cache_queries", "prompt tokens looked up in the prefix cache",
                                  value=stats.queried_tokens)
        yield CounterMetricFamily("batchproof_prefix_cache_hits", "prompt tokens served from the prefix cache",
                                  value=stats.hit_tokens)
        yield CounterMetricFamily("batchproof_prefix_cache_misses", "prompt tokens the prefix cache did not hold",
                                  value=stats.queried_tokens - stats.hit_tokens)
        yield CounterMetricFamily("batchproof_prefix_cache_evictions", "blocks evicted from the prefix cache",
                                  value=stats.evicted_blocks)
        yield GaugeMetricFamily("batchproof_prefix_cache_bytes", "bytes held by the prefix cache", value=cache.nbytes)
        yield GaugeMetricFamily("batchproof_prefix_cache_budget_bytes", "bytes the prefix cache may hold",
                                value=cache.budget_bytes)
        yield GaugeMetricFamily("batchproof_prefix_cache_blocks", "blocks held by the prefix cache", value=len(cache))


class RequestCounter:
    """ASGI middleware counting every HTTP response by route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                self.metrics.requests.labels(route=path, status=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
