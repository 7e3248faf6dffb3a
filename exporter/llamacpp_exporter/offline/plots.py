"""`analyze --plot DIR`: PNG charts of the investigation, drawn with matplotlib (the optional
extra `plot`: `pip install matplotlib`). The figures behind each chart are pure functions, tested
against the report's own counts.

- miss-rate.png: RAM and slot miss rate over time by LoRA state, each point with its count;
- prefill.png: every request's prefill duration over time, by slot-selection path;
- time-per-output-token.png: time per output token while another slot prefilled, and not.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ..records import LORA_STATES, RequestRecord

BINS = 24


def time_axis(dated: list[tuple[float | None, RequestRecord]]) -> tuple[list[Any], str]:
    """Each record's place on the x axis: its wall-clock time when every record has one, else
    its position in the log (runs that cannot be dated are never given a made-up time)."""
    if dated and all(t is not None for t, _ in dated):
        return [datetime.fromtimestamp(t) for t, _ in dated if t is not None], "time"
    return list(range(len(dated))), "request, in log order"


def miss_rate_bins(
    xs: list[Any], records: list[RequestRecord], bins: int | None = None
) -> dict[str, list[tuple[Any, ...]]]:
    """For each LoRA state: (x of the bin's first request, misses, requests with an outcome)
    over equal shares of the x range (about ten requests a bin, at most BINS). Only bins with
    requests."""
    points = [(x, r) for x, r in zip(xs, records, strict=True) if r.outcome is not None]
    out: dict[str, list[tuple[Any, ...]]] = {lo: [] for lo in LORA_STATES}
    if not points:
        return out
    if bins is None:
        bins = max(1, min(BINS, len(points) // 10))
    points.sort(key=lambda p: p[0])
    lo_x, hi_x = points[0][0], points[-1][0]
    span = hi_x - lo_x

    def index(x: Any) -> int:
        if not span:
            return 0
        frac = (x - lo_x) / span
        return min(bins - 1, int(frac * bins))

    acc: dict[tuple[str, int], list[Any]] = {}
    for x, r in points:
        key = (r.lora, index(x))
        a = acc.setdefault(key, [x, 0, 0])
        a[1] += r.outcome == "miss"
        a[2] += 1
    for (lora, _), (x, miss, n) in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault(lora, []).append((x, miss, n))
    return out


def draw(dir_path: str, dated: list[tuple[float | None, RequestRecord]]) -> list[str]:
    import matplotlib  # noqa: PLC0415 - an optional extra, loaded only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out_dir = Path(dir_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(dated)), key=lambda i: (dated[i][0] is None, dated[i][0] or 0.0))
    dated = [dated[i] for i in order]
    xs, xlabel = time_axis(dated)
    records = [r for _, r in dated]
    written = []

    fig, ax = plt.subplots(figsize=(10, 4.5))
    colours = {"none": "tab:blue", "active": "tab:red", "unknown": "tab:gray"}
    for lora, pts in miss_rate_bins(xs, records).items():
        if not pts:
            continue
        total_miss, total = sum(p[1] for p in pts), sum(p[2] for p in pts)
        ax.plot(
            [p[0] for p in pts],
            [100 * p[1] / p[2] for p in pts],
            marker="o",
            color=colours[lora],
            label=f"LoRA {lora}: {100 * total_miss / total:.0f}% ({total_miss}/{total})",
        )
        for x, miss, n in pts:
            ax.annotate(f"{miss}/{n}", (x, 100 * miss / n), textcoords="offset points", xytext=(0, 6), fontsize=7)
    ax.set_ylim(-5, 110)
    ax.set_ylabel("miss rate, %")
    ax.set_xlabel(xlabel)
    ax.set_title("Prompt-cache miss rate by LoRA state (requests with a cache outcome; points: misses/requests)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "miss-rate.png"))

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for path, colour in (
        ("ram", "tab:orange"),
        ("slot", "tab:green"),
        ("pinned", "tab:purple"),
        ("unknown", "tab:gray"),
    ):
        pts = [(x, r.prefill_seconds) for x, r in zip(xs, records, strict=True) if r.path == path and r.prefill_seconds]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color=colour, label=f"{path} ({len(pts)})")
    if any(r.prefill_seconds for r in records):
        ax.set_yscale("log")
        ax.legend(loc="upper left", fontsize=8, title="slot selection")
    ax.set_ylabel("prefill, s")
    ax.set_xlabel(xlabel)
    ax.set_title("Prefill duration of each request")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "prefill.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    groups = {
        "while another slot prefilled": [r.time_per_output_token_seconds * 1000 for r in records if r.contention == "prefill" and r.time_per_output_token_seconds],
        "no concurrent prefill": [r.time_per_output_token_seconds * 1000 for r in records if r.contention == "none" and r.time_per_output_token_seconds],
    }  # fmt: skip
    values = [v for vs in groups.values() for v in vs]
    if values:
        edges = _edges(min(values), max(values))
        for (label, vs), colour in zip(groups.items(), ("tab:red", "tab:blue"), strict=True):
            if vs:
                med = sorted(vs)[len(vs) // 2]
                ax.hist(vs, bins=edges, alpha=0.6, color=colour, label=f"{label}: {len(vs)}, median {med:.1f} ms")
        ax.legend(fontsize=8)
    ax.set_xlabel("time per output token, ms")
    ax.set_ylabel("requests")
    ax.set_title("Generation speed with and without another slot's prefill")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "time-per-output-token.png"))
    plt.close("all")
    return written


def _edges(lo: float, hi: float, n: int = 30) -> list[float]:
    if hi <= lo:
        return [lo - 0.5, lo + 0.5]
    step = (hi - lo) / n
    return [lo + i * step for i in range(n + 1)]


def _save(fig: Any, path: Path) -> str:
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return str(path)


def available() -> bool:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True
