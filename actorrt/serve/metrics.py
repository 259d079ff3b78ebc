"""The server's Prometheus metrics, in one ``CollectorRegistry`` per app (two
apps in one process never share counters)."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics", "ENDPOINTS"]

#: the endpoint label's values; any other path counts as ``"other"`` (bounded
#: label cardinality whatever clients send)
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                    0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)


class ServerMetrics:
    """Counters, gauges and histograms of one server.

    Metric names (all prefixed ``actorrt_``):

    * ``requests_total{endpoint, status}``: HTTP requests answered, by path and
      status code (a stream counts once, with its 200);
    * ``prompt_tokens_total``, ``generation_tokens_total``: the tokens that
      responses' ``usage`` reports (and a cancelled request's tokens so far);
    * ``requests_running``, ``requests_queued``: engine requests decoding /
      prefilling, and waiting for admission (read at scrape time);
    * ``kv_cache_bytes``: bytes the engine's KV caches hold now;
    * ``time_to_first_token_seconds``: request arrival to each choice's first
      token; ``inter_token_latency_seconds``: gap between a choice's
      successive tokens as they reach the HTTP layer (tokens handed over
      together count a ~0 gap).

    Args:
        stats: returns the engine's :class:`~actorrt.genai.EngineStatistics`.
    """

    def __init__(self, stats: Callable):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("actorrt_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("actorrt_prompt_tokens", "prompt tokens of requests",
                                     registry=r)
        self.generation_tokens = Counter("actorrt_generation_tokens", "tokens generated",
                                         registry=r)
        Gauge("actorrt_requests_running", "engine requests prefilling or decoding",
              registry=r).set_function(lambda: stats().active)
        Gauge("actorrt_requests_queued", "engine requests waiting for admission",
              registry=r).set_function(lambda: stats().waiting)
        Gauge("actorrt_kv_cache_bytes", "bytes held by KV caches",
              registry=r).set_function(lambda: stats().kv_bytes)
        self.ttft = Histogram("actorrt_time_to_first_token_seconds",
                              "request arrival to a choice's first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("actorrt_inter_token_latency_seconds",
                             "gap between a choice's successive tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(path if path in ENDPOINTS else "other", str(status)).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
