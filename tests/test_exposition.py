"""/metrics renders only what changed (export/exposition.py): its bytes must be prometheus_client's
for the same registry, at every scrape, in every format, whatever changed in between."""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.export.conversations import ConversationCollector, ConversationCosts
from llamacpp_exporter.export.exposition import (
    ExpositionRegistry,
    RenderedChildren,
    make_metrics_app,
    negotiate,
    render_families,
)
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.sources.server_answers import _legacy_name, rename_server_metrics

LOGS = Path(__file__).parent / "fixtures" / "logs"
disable_created_metrics()  # as test_golden: _created samples carry the wall clock

# what Prometheus 2.x sends, and what a browser or curl gets
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ACCEPTS = [PROMETHEUS_ACCEPT, "", "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8"]
LIBRARY: dict[str, Callable[[CollectorRegistry], bytes]] = {
    PROMETHEUS_ACCEPT: generate_openmetrics,
    "": generate_latest,
}


def _library(accept: str, registry: CollectorRegistry) -> bytes:
    if accept in LIBRARY:
        return bytes(LIBRARY[accept](registry))
    return bytes(generate_openmetrics(registry, escaping=ALLOWUTF8))


def _populated(
    log: str, registry: CollectorRegistry, scrape: Callable[[int], object] | None = None, every: int = 0
) -> Pipeline:
    costs = ConversationCosts(clock=lambda: 1_800_000_000.0)
    registry.register(ConversationCollector(costs))
    pl = Pipeline(registry, clock=lambda: 1_800_000_000.0, pseudonymize=Pseudonymizer("salt"), costs=costs)
    with open(LOGS / log, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh):
            pl.process_line(line.rstrip("\r\n"), 1_800_000_000.0)
            if scrape is not None and every and i % every == 0:
                scrape(i)
    pl.flush()
    return pl


@pytest.mark.parametrize(
    "log", ["lv4-np2-text.log", "lv4-np1-seed-scenario.log", "lv3-np2-text.log", "router-two-models.log"]
)
def test_every_scrape_is_the_librarys_rendering_while_the_log_is_read(log: str) -> None:
    # 60 scrapes while the log is read, each format in turn: a child kept from an earlier scrape that
    # changed since, or one removed (a router's model forgotten), shows as a difference
    reg = ExpositionRegistry()
    compared: list[int] = []

    def scrape(i: int) -> None:
        accept = ACCEPTS[len(compared) % len(ACCEPTS)]
        ours = reg.render(negotiate(accept))
        assert ours == _library(accept, reg), f"{log}: scrape after line {i} ({accept or 'text'}) differs"
        compared.append(i)

    lines = sum(1 for _ in open(LOGS / log, "rb"))
    _populated(log, reg, scrape, every=max(1, lines // 60))
    for accept in ACCEPTS:
        assert reg.render(negotiate(accept)) == _library(accept, reg)
    assert len(compared) >= 60


def test_the_http_body_is_the_librarys_and_gzip_and_selections_still_work() -> None:
    reg = ExpositionRegistry()
    _populated("lv4-np2-text.log", reg)
    app = make_metrics_app(reg)

    def get(accept: str, encoding: str = "", query: str = "", method: str = "GET") -> tuple[str, dict[str, str], bytes]:
        status = []
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": "/metrics",
            "QUERY_STRING": query,
            "HTTP_ACCEPT": accept,
            "HTTP_ACCEPT_ENCODING": encoding,
            "wsgi.input": io.BytesIO(),
        }
        body = b"".join(app(environ, lambda s, h: status.append((s, dict(h)))))
        return status[0][0], status[0][1], body

    status, headers, body = get(PROMETHEUS_ACCEPT, "gzip")
    assert status == "200 OK" and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert gzip.decompress(body) == generate_openmetrics(reg)
    status, headers, body = get("")
    assert "Content-Encoding" not in headers and body == generate_latest(reg)
    # a selection is prometheus_client's own
    _, _, body = get("", query="name[]=llamacpp_requests_total")
    assert body.decode().splitlines()[1] == "# TYPE llamacpp_requests_total counter"
    assert all(ln.startswith(("#", "llamacpp_requests_total{")) for ln in body.decode().splitlines())
    assert get("", method="POST")[0].startswith("405")


def test_a_format_that_adds_families_of_its_own_is_rendered_whole() -> None:
    # counters with a created time: the text format writes a family of _created samples after
    # the counter's, so a child cannot be cut out; the family is rendered whole instead
    def family(children: Iterable[tuple[Any, Any]]) -> Metric:
        f = CounterMetricFamily("x", "doc", labels=["k"])
        for key, value in children:
            f.add_metric(key, value, created=1.0)
        return f

    kept = RenderedChildren(family)
    children: list[tuple[Hashable, Any, Any]] = [(("a",), 1.0, 1.0), (("b",), 2.0, 2.0)]
    for accept in ("", PROMETHEUS_ACCEPT):
        enc = negotiate(accept)
        whole = render_families(enc, [family([(k, c) for k, _, c in children])])
        assert b"".join(kept.render(enc, children)) == whole
    assert b"x_created" in whole


def test_llama_servers_names_become_legacy_names() -> None:
    # what negotiate() relies on: every name of llama-server's it re-exports is letters, digits
    # and underscores (invented names with characters a legacy name cannot hold)
    fams = rename_server_metrics(
        "# HELP llamacpp:requests_processing Requests.\n# TYPE llamacpp:requests_processing gauge\n"
        'llamacpp:requests_processing{"slot.id"="1"} 2\n'
    )
    assert [(s.name, s.labels) for f in fams for s in f.samples] == [
        ("llamacpp_server_requests_processing", {"slot_id": "1"})
    ]
    assert _legacy_name("llamacpp:odd.name-x:y") == "llamacpp_server_odd_name_x_y"
    assert _legacy_name("9lives") == "_lives"


def test_prometheus_clients_own_collectors_render_through_it() -> None:
    reg = ExpositionRegistry()
    g = Gauge("plain_gauge", "A gauge.", ["k"], registry=reg)
    g.labels("x").set(3)
    for accept in ACCEPTS:
        assert reg.render(negotiate(accept)) == _library(accept, reg)
    reg.unregister(g)
    assert reg.render(negotiate("")) == b""


def _readme_metric_rows() -> list[tuple[list[str], str]]:
    """The README's metrics table: each row's names (a name starting with "_" shares the
    first name's beginning: `llamacpp_prompt_cache_entries`, `_bytes`) and its type cell."""
    rows = []
    for line in (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines():
        if line.startswith("| `") and line.count("|") >= 5:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    return rows


def test_the_readme_metrics_table_is_what_the_exporter_exports(tmp_path: Path) -> None:
    from support import exported_families

    from llamacpp_exporter.export.otlp import TraceCounts
    from llamacpp_exporter.export.web_config import WebConfigFile

    families = exported_families()
    web = CollectorRegistry()  # the families only an exporter with --web.config.file has
    (tmp_path / "web.yml").write_text("{}\n")
    WebConfigFile(str(tmp_path / "web.yml"), web)
    web.register(TraceCounts(lambda: 0))  # and those of an exporter sending traces
    families |= {f.name + ("_total" if f.type == "counter" else ""): f.type for f in web.collect()}
    listed, wrong = set(), []
    for names, kind in _readme_metric_rows():
        first = names[0]
        for name in names:
            if name.endswith("*"):  # llama-server's own, renamed; the process collector's
                found = [f for f in families if f.startswith(name[:-1])]
                if not found and not name.startswith("llamacpp_server_"):
                    wrong.append(f"{name}: no such family")
                listed |= set(found)
                continue
            if name.startswith("_"):
                parts = first.split("_")
                candidates = ["_".join(parts[:i]) + name for i in range(len(parts) - 1, 0, -1)]
                name = next((c for c in candidates if c in families), candidates[0])
            if name not in families:
                wrong.append(f"{name}: listed in the README, not exported")
            elif families[name] not in kind:
                wrong.append(f"{name}: a {families[name]}, the README says {kind}")
            listed.add(name)
    assert not wrong, wrong
    assert set(families) - listed == set(), "exported, not in the README's table"


def test_a_histograms_bucket_is_the_one_bisect_finds() -> None:
    """families._first_at_least, written out for the compiled build, against the bisect module
    on real bucket bounds, each bound itself, values between and beyond them."""
    import bisect
    import math

    from llamacpp_exporter.export import families

    for buckets in ((0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0), (1.0,), (16, 64, 256, 1024, 4096, 16384)):
        bounds = [float(b) for b in buckets] + [math.inf]
        values = (
            [-math.inf, -1.0, 0.0, math.inf] + bounds + [b * f for b in bounds[:-1] for f in (0.5, 0.999, 1.001, 2)]
        )
        for v in values:
            assert families._first_at_least(bounds, v) == bisect.bisect_left(bounds, v), (buckets, v)
