"""/metrics as prometheus_client renders it, without rendering again what did not change.

A scrape used to render every sample of every family (about 25 us each in the OpenMetrics
format that Prometheus asks for). Most of a populated exporter's samples are unchanged from one
scrape to the next: label combinations that were never used, histograms of paths that saw no
request. The plain-number families keep each child's exposition, cut out of prometheus_client's
own rendering of a family holding that child alone, and render it again only when its numbers
changed; every other collector is rendered by prometheus_client at each scrape. The bytes are
the library's (tests compare them with ``generate_latest`` of the same registry).
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Callable, Hashable, Iterable
from typing import Any, cast
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

# (content type, prometheus_client encoder): a cached rendering belongs to its content type
Encoding = tuple[str, Callable[[Any], bytes]]
GZIP_LEVEL = 1  # 8x faster than gzip's default 9 on a 100 KiB exposition, for a body 20% larger


class _Families:
    """What an encoder renders: anything with collect()."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def negotiate(accept: str | None) -> Encoding:
    """prometheus_client's choice of format for this Accept header.

    In OpenMetrics with its default escaping (underscores), prometheus_client 0.26 checks each
    sample's name a character at a time (client_python#1114), half of a scrape. For a name of
    letters, digits and underscores, the only names this exporter exposes (ours are fixed,
    llama-server's are made so when polled), allow-utf-8 renders the same bytes, without that.
    """
    encoder, content_type = choose_encoder(accept or "")
    if (
        isinstance(encoder, functools.partial)
        and encoder.func is openmetrics.generate_latest
        and encoder.keywords.get("escaping") == openmetrics.UNDERSCORES
    ):
        encoder = functools.partial(
            encoder.func, *encoder.args, **{**encoder.keywords, "escaping": openmetrics.ALLOWUTF8}
        )
    return content_type, encoder


_TRAILERS: dict[str, bytes] = {}


def _trailer(encoding: Encoding) -> bytes:
    t = _TRAILERS.get(encoding[0])
    if t is None:
        t = _TRAILERS[encoding[0]] = encoding[1](_Families([]))  # b"# EOF\n" in OpenMetrics, b"" in text
    return t


def render_families(encoding: Encoding, families: Iterable[Metric]) -> bytes:
    """Families rendered by prometheus_client, without the format's trailer."""
    out = encoding[1](_Families(families))
    trailer = _trailer(encoding)
    return out[: len(out) - len(trailer)]


class RenderedChildren:
    """One family's exposition kept child by child, for each content type asked for.

    ``family(children)`` builds the family holding the given (key, child) pairs. A child is
    rendered again when its version (its value, or its number of observations) changed.
    """

    def __init__(self, family: Callable[[Iterable[tuple[Any, Any]]], Metric]) -> None:
        self._family = family
        self._by_type: dict[str, tuple[bytes, dict[Hashable, tuple[Any, bytes]]]] = {}

    def render(self, encoding: Encoding, children: list[tuple[Hashable, Any, Any]]) -> list[bytes]:
        content_type = encoding[0]
        entry = self._by_type.get(content_type)
        if entry is None:
            entry = self._by_type[content_type] = (render_families(encoding, [self._family([])]), {})
        header, kept = entry
        parts = [header]
        for key, version, child in children:
            hit = kept.get(key)
            if hit is None or hit[0] != version:
                whole = render_families(encoding, [self._family([(key, child)])])
                body = whole[len(header) :]
                if not whole.startswith(header) or body.startswith(b"# ") or b"\n# " in body:
                    # not one header then this child's samples (a format that adds families of
                    # its own): render the family whole, as prometheus_client would
                    return [render_families(encoding, [self._family([(k, c) for k, _, c in children])])]
                hit = kept[key] = (version, body)
            parts.append(hit[1])
        if len(kept) > len(children):  # children removed (a model forgotten)
            current = {key for key, _, _ in children}
            for key in [k for k in kept if k not in current]:
                del kept[key]
        return parts


class ExpositionRegistry(CollectorRegistry):
    """A CollectorRegistry that also keeps its collectors in order, so that a scrape renders
    each one on its own: through its ``render_exposition`` where it keeps its rendering, else
    through prometheus_client. The same collectors in the same order as ``collect()``."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self.collectors.remove(collector)

    def render(self, encoding: Encoding) -> bytes:
        parts: list[bytes] = []
        for c in list(self.collectors):
            own = getattr(c, "render_exposition", None)
            if own is not None:
                parts.extend(own(encoding))
            else:
                parts.append(render_families(encoding, c.collect()))
        parts.append(_trailer(encoding))
        return b"".join(parts)


def make_metrics_app(registry: CollectorRegistry) -> Callable[[dict[str, Any], Callable[..., Any]], list[bytes]]:
    """The /metrics WSGI app: prometheus_client's, but for the body of a plain GET, which an
    ExpositionRegistry renders from what it kept (a ?name[]= selection goes to the library)."""
    library_app = make_wsgi_app(registry)
    if not isinstance(registry, ExpositionRegistry):
        return library_app

    def metrics_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("REQUEST_METHOD") != "GET" or "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return cast(list[bytes], library_app(environ, start_response))
        content_type, encoder = negotiate(environ.get("HTTP_ACCEPT"))
        body = registry.render((content_type, encoder))
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return metrics_app
