"""What llama-server's endpoints answer, read: pure functions of an answer's body (/slots,
/lora-adapters, /models, /metrics). Text fields (prompts, generated text) are never read."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..records import MAX_SLOTS, LoraAdapters, SlotsSnapshot, SlotState

SERVER_PREFIX = "llamacpp_server_"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# objects in a /slots answer, at most: a slot is a few dozen (its params, its LoRA list)
MAX_SLOTS_OBJECTS = MAX_SLOTS * 256


def slots_json(body: bytes) -> Any:
    """Parse /slots, refusing an answer of far more objects than any server's slots hold
    before building them (31 MB of tiny objects would take the better part of a GiB)."""
    if body.count(b"{") > MAX_SLOTS_OBJECTS:
        raise ValueError(f"/slots holds more than {MAX_SLOTS_OBJECTS} objects")
    return json.loads(body)


def parse_slots(obj: Any, model: str = "") -> SlotsSnapshot:
    """``/slots`` JSON -> numeric slot states. Text fields (prompt, generated) are never read."""
    if not isinstance(obj, list):
        raise ValueError("/slots did not return a list")
    if len(obj) > MAX_SLOTS:
        raise ValueError(f"/slots listed {len(obj)} slots, more than {MAX_SLOTS}")
    slots = []
    for el in obj:
        if not isinstance(el, dict) or _int(el.get("id")) is None:
            continue
        if not 0 <= el["id"] < len(obj):
            continue  # llama-server numbers its slots 0..n-1; another id would be a new series
        params = el.get("params") if isinstance(el.get("params"), dict) else {}
        lora_raw = params.get("lora") if params else None
        lora: tuple[tuple[int, float], ...] | None = None
        if isinstance(lora_raw, list):
            items = []
            for a in lora_raw:
                if isinstance(a, dict) and _int(a.get("id")) is not None and isinstance(a.get("scale"), (int, float)):
                    items.append((int(a["id"]), float(a["scale"])))
            lora = tuple(sorted(items))
        nt = el.get("next_token")
        n_decoded = None
        if isinstance(nt, list) and nt and isinstance(nt[0], dict):
            n_decoded = _int(nt[0].get("n_decoded"))
        slots.append(
            SlotState(
                id=el["id"],
                id_task=_int(el.get("id_task")),
                is_processing=bool(el.get("is_processing")),
                n_prompt_tokens=_int(el.get("n_prompt_tokens")),
                n_prompt_tokens_processed=_int(el.get("n_prompt_tokens_processed")),
                n_prompt_tokens_cache=_int(el.get("n_prompt_tokens_cache")),
                n_decoded=n_decoded,
                lora=lora,
                n_ctx=_int(el.get("n_ctx")),
            )
        )
    return SlotsSnapshot(tuple(slots), model)


def context_usage(snap: SlotsSnapshot) -> float:
    """Tokens held over context size, summed over the slots; NaN if /slots does not say."""
    held = total = 0
    for s in snap.slots:
        if s.n_ctx is None or s.n_ctx <= 0:
            return float("nan")
        total += s.n_ctx
        held += min((s.n_prompt_tokens or 0) + (s.n_decoded or 0), s.n_ctx)
    return held / total if total else float("nan")


def loaded_models(obj: Any) -> list[str] | None:
    """A router's ``/models``: the models loaded now (status "loaded"). None when the answer is
    not a router's (a plain server's entries have no status)."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    out, router = [], False
    for m in data:
        if not isinstance(m, dict):
            continue
        status = m.get("status")
        if not isinstance(status, dict):
            continue
        router = True
        if status.get("value") == "loaded" and isinstance(m.get("id"), str):
            out.append(m["id"])
    return out if router else None


def with_model_label(families: list[Metric], model: str) -> list[Metric]:
    for fam in families:
        fam.samples = [Sample(s.name, {**s.labels, "model": model}, s.value) for s in fam.samples]
    return families


def merge_families(per_model: list[list[Metric]]) -> list[Metric]:
    """One family per name, with every model's samples."""
    merged: dict[str, Metric] = {}
    for fams in per_model:
        for fam in fams:
            if fam.name in merged:
                merged[fam.name].samples.extend(fam.samples)
            else:
                merged[fam.name] = fam
    return list(merged.values())


def parse_lora_adapters(obj: Any, model: str = "") -> LoraAdapters:
    if not isinstance(obj, list):
        raise ValueError("/lora-adapters did not return a list")
    scales = []
    for a in obj:
        if isinstance(a, dict) and _int(a.get("id")) is not None and isinstance(a.get("scale"), (int, float)):
            scales.append((int(a["id"]), float(a["scale"])))
    return LoraAdapters(tuple(sorted(scales)), model)


MAX_SERVER_SERIES = 1000  # per re-exported family: llama-server's own have a handful

# llama-server's throughput gauges are averages since the previous GET /metrics, and each GET
# resets them (server-context.cpp, b11434 around line 5040): the exporter's own poll defines
# their window, and a Prometheus scraping llama-server as well sees shorter averages.
_RESET_BY_POLL = ("prompt_tokens_seconds", "predicted_tokens_seconds")
_RESET_HELP = (
    " Averaged since the previous GET /metrics, which resets it: here, since the exporter's previous "
    "poll. Prefer rate() of the _total counters."
)
# Since llama.cpp PR #26920 (b11434 has it) prompt_tokens_total excludes tokens reused from the
# cache, which prompt_tokens_cached_total counts; before it, prompt_tokens_total counted them in.
_PROMPT_HELP_NEW = (
    "Prompt tokens computed (prefilled), tokens reused from the cache excluded: this build reports them in "
    "llamacpp_server_prompt_tokens_cached_total (llama.cpp PR #26920 and later)."
)
_PROMPT_HELP_OLD = (
    "Prompt tokens processed, tokens reused from the cache included: this build predates llama.cpp PR #26920 "
    "(it has no prompt_tokens_cached_total)."
)


_NOT_LEGACY = re.compile(r"[^a-zA-Z0-9_]|^[0-9]")


def _legacy_name(name: str) -> str:
    """``llamacpp:x`` -> ``llamacpp_server_x``, and every character but letters, digits and
    underscores made an underscore: colons are for recording rules, and /metrics relies on
    legacy names (exposition.negotiate)."""
    return _NOT_LEGACY.sub("_", name.replace("llamacpp:", SERVER_PREFIX, 1))


def rename_server_metrics(text: str) -> list[Metric]:
    """llama-server's ``llamacpp:name`` families -> ``llamacpp_server_name``.

    Colons are reserved for recording rules. A family declared counter whose sample does
    not end in ``_total`` (``n_tokens_max``, a high-water mark) is re-typed gauge. A family
    with more than MAX_SERVER_SERIES series is cut there (ValueError after the rest: counted).
    """
    out = []
    cut = []
    # the client parser appends _total to counter samples that lack it: note the real names
    raw_names = {ln.split("{", 1)[0].split(" ", 1)[0] for ln in text.splitlines() if ln and ln[0] != "#"}
    cached_counted_apart = "llamacpp:prompt_tokens_cached_total" in raw_names
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("llamacpp:"):
            continue  # only llama-server's own families: anything else could clash with ours
        name = _legacy_name(fam.name)
        typ = fam.type
        samples = [
            Sample(_legacy_name(s.name), {_legacy_name(k): v for k, v in s.labels.items()}, s.value)
            for s in fam.samples
        ]
        if typ == "counter" and fam.name in raw_names:
            typ = "gauge"
            samples = [Sample(name, s.labels, s.value) for s in samples]
        if typ not in ("counter", "gauge"):
            typ = "untyped"
        if len(samples) > MAX_SERVER_SERIES:
            cut.append(f"{name} ({len(samples)} series)")
            samples = samples[:MAX_SERVER_SERIES]
        doc = fam.documentation or name
        short = name.removeprefix(SERVER_PREFIX)
        if short in _RESET_BY_POLL:
            doc += _RESET_HELP
        elif short == "prompt_tokens":
            doc = _PROMPT_HELP_NEW if cached_counted_apart else _PROMPT_HELP_OLD
        m = Metric(name, doc, typ)
        m.samples = samples
        out.append(m)
    if cut:
        raise TooManySeries(out, cut)
    return out


class TooManySeries(ValueError):
    """Families cut at MAX_SERVER_SERIES; ``families`` holds what is re-exported."""

    def __init__(self, families: list[Metric], cut: list[str]) -> None:
        super().__init__(f"more than {MAX_SERVER_SERIES} series in: {', '.join(cut)[:300]}")
        self.families = families


# ---------------------------------------------------------------- the poller
