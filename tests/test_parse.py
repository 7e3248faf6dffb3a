"""The parser on real lines, one test per line kind, plus the envelope variants
(timestamps off, prefix off, colours, router prefix, JSONL) and malformed input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import value

from llamacpp_exporter import parse as p

LOGS = Path(__file__).parent / "fixtures" / "logs"


def real_line(fragment: str, log: str = "lv4-np2-text.log") -> str:
    for line in (LOGS / log).read_text(errors="replace").splitlines():
        if fragment in line:
            return line
    raise AssertionError(f"no line with {fragment!r} in {log}")


CASES = [
    ("initializing ...", p.ServerStarting()),
    ("verbosity = 4", p.Verbosity(4)),
    ("initializing, n_slots", p.SlotsInitialized(2, 8192)),
    ("prompt cache is enabled, size limit", p.CacheEnabled(512.0)),
    ("conv_id=conv-1-0", p.ConversationArrived("conv-1-0")),
    ("selected slot by LRU, t_last = -1", p.SlotSelected(1, "lru")),
    ("selected slot by LCP similarity", p.SlotSelected(0, "lcp", 1.0, 0.874)),
    ("updating prompt cache", p.CacheUpdateStarted()),
    ("saving prompt with length 255", p.PromptSaved(255, 4.489)),
    ("prompt is already in the cache", p.PromptSaveSkipped("already_cached")),
    ("looking for better prompt, base f_keep = 0.036", None),
    ("prompt with length     255, lcp", None),
    ("found better prompt", None),
    ("cache state: 1 prompts, 10.265 MiB", p.CacheState(1, 10.265, 512.0, 16384, 16384)),
    ("   - prompt 0x5593369e7000:     255 tokens", p.CacheEntryListed("0x5593369e7000", 255, 10.265, 2)),
    ("prompt cache update took 4.13 ms", p.CacheUpdateTook(4.13)),
    ("clearing cache for lora change. 0 loras -> 1 loras", p.LoraCacheCleared(1, 0, 1)),
    ("task 0 | processing task, is_child = 0", p.TaskLaunched(1, 0, False)),
    ("saving idle slot to prompt cache", p.IdleSlotSaving(0)),
    ("task 0 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 1587", p.NewPrompt(1, 0, 1587)),
    ("task 3 | cached n_tokens = 0,", p.CachedTokens(0, 3, 0)),
    ("forcing full prompt re-processing", None),
    ("task 2 | init sampler", p.PrefillFinished(0, 2)),
    ("task 0 | prompt processing, n_tokens =   1517", p.PrefillProgress(1, 0, 1517)),
    ("task 2 | prompt eval time =     533.55 ms /   232 tokens", p.PromptTiming(0, 2, 533.55, 232)),
    ("task 2 |        eval time =     556.46 ms /    24 tokens", p.EvalTiming(0, 2, 556.46, 24, 24.19)),
    ("task 2 | stop processing: n_tokens = 255, truncated = 0", p.TaskReleased(0, 2, 255, False)),
    ("sampler chain:", None),
    ("llama_model_loader: - kv   0", p.Ignored()),
]


@pytest.mark.parametrize("fragment,expected", CASES, ids=[c[0][:40] for c in CASES])
def test_real_line_kinds(fragment: str, expected: p.Event) -> None:
    line = real_line(fragment)
    parsed = p.parse_line(line)
    assert parsed.ts_us is not None
    if expected is None:
        assert not isinstance(parsed.event, (p.Ignored, p.Unrecognized)), line
    else:
        assert parsed.event == expected, line


def test_evictions_say_which_limit_made_them() -> None:
    making_room = p.parse_line(real_line("making room for prompt cache entry", "lv4-np1-cache-thrashing.log"))
    assert making_room.event == p.CacheEvicted(33.169, True, False)
    # invented from server_prompt_cache::update's format string: no recorded log has a cache
    # without a byte limit that filled its token limit
    line = (
        "0.10.000.000 W srv        update:  - cache token limit (4096, est: 4096) reached, removing oldest entry "
        "(size = 12.500 MiB)"
    )
    assert p.parse_line(line).event == p.CacheEvicted(12.5, False, True)


def test_candidate_and_restore_keep_printed_values() -> None:
    cand = p.parse_line(real_line("prompt with length     255, lcp")).event
    assert isinstance(cand, p.CacheCandidate) and cand.n_tokens == 255
    found = p.parse_line(real_line("found better prompt")).event
    assert isinstance(found, p.CacheRestored) and (found.f_keep.startswith("0.") or found.f_keep == "1.000")


def test_timestamp_is_microseconds_since_start() -> None:
    assert p.parse_line("1.23.135.796 I slot launch_slot_: id  2 | task 17 | processing task, is_child = 0").ts_us == (
        60_000_000 + 23_000_000 + 135_000 + 796
    )
    # minutes are not wrapped: two hours and three minutes
    assert p.parse_line("123.04.123.456 I srv  llama_server: initializing ...").ts_us == 123 * 60_000_000 + 4_123_456


LAUNCH = "slot launch_slot_: id  2 | task 17 | processing task, is_child = 0"


@pytest.mark.parametrize(
    "line",
    [
        "0.01.108.522 I " + LAUNCH,  # default
        "I " + LAUNCH,  # --no-log-timestamps
        LAUNCH,  # --no-log-prefix
        "\x1b[34m0.01.108.522\x1b[0m \x1b[32mI \x1b[0m" + LAUNCH,  # colours (invented: rendered per log.cpp)
        "[ 8081] 0.01.108.522 I " + LAUNCH,  # router prefix (invented: rendered per server-models.cpp)
        json.dumps({"type": "log", "time": 68522, "level": "info", "msg": LAUNCH + "\n"}),
    ],
    ids=["default", "no-timestamps", "no-prefix", "ansi", "router", "jsonl"],
)
def test_envelopes(line: str) -> None:
    assert p.parse_line(line).event == p.TaskLaunched(2, 17, False)


def test_jsonl_real_record() -> None:
    line = real_line("processing task", "lv4-np2-jsonl.log")
    parsed = p.parse_line(line)
    assert isinstance(parsed.event, p.TaskLaunched)
    assert parsed.ts_us == json.loads(line)["time"]


def test_multiline_continuation_is_ignored() -> None:
    assert isinstance(p.parse_line("\trepeat_last_n = 64, repeat_penalty = 1.000").event, p.Ignored)


@pytest.mark.parametrize(
    "line",
    [  # invented variants of a real continuation line
        "\trepeat_last_n = 64, repeat_penalty = 1.000",
        "\trepeat_last_n = 64,\trepeat_penalty = 1.000",  # another tab: not printable, no control character
        "\trepeat_last_n = 64, repeat\u00a0penalty",  # a no-break space: not printable either
        "\trepeat_last_n = 64\x01",  # a control character: unreadable
        "\trepeat_last_n = 64\x7f",
    ],
)
def test_a_continuation_line_is_read_as_the_general_path_reads_it(line: str) -> None:
    assert p._parse_line(line) == p._parse_general(line)
    assert isinstance(p.parse_line("<|im_start|>user").event, p.Ignored)


@pytest.mark.parametrize(
    "line",
    [
        "0.01.108.522 I slot launch_slot_: id  0 | task 3 | a message no build of ours prints",  # invented
        "0.01.108.522 I slot launch_slot_: malformed slot line without ids",  # invented
        '{"type":"log","time":',  # truncated JSONL record
    ],
)
def test_unknown_and_malformed_lines_are_unrecognized(line: str) -> None:
    assert isinstance(p.parse_line(line).event, p.Unrecognized)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("", p.Ignored),
        ("\x00\xff", p.Unreadable),
        ("{" * 10000, p.Unrecognized),  # a JSONL record that is not one
        ("0.00.000.000 I slot" + " " * 5000, p.Ignored),  # a prefix and no message
        ("9" * 100_000, p.Ignored),  # text without a prefix: another program's output
        ("[" * 5000, p.Ignored),
    ],
)
def test_garbage_is_classified_by_the_parser_itself(line: str, kind: type) -> None:
    """The parser proper (not parse_line's safety net, which would hide a raise) handles it."""
    assert type(p._parse_line(line).event) is kind


def test_a_parser_bug_costs_one_unrecognized_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(line: str) -> p.ParsedLine:
        raise IndexError("a bug")

    monkeypatch.setattr(p, "_parse_line", broken)
    assert p.parse_line("0.01.108.522 I slot launch_slot_: id  0 | task 3 | processing task").event == p.UNRECOGNIZED


def test_debug_lines_carry_no_text() -> None:
    # invented: a DEBUG line as -lv 5 prints it, with request content
    parsed = p.parse_line(
        '0.02.000.000 D slot launch_slot_: id  0 | task 4 | launching slot : {"prompt":"secret words"}'
    )
    assert parsed.event == p.DebugLine()
    assert "secret" not in repr(parsed)


@pytest.mark.parametrize("log", sorted(str(f.relative_to(LOGS)) for f in LOGS.rglob("*.log")))
def test_recorded_logs_have_no_unrecognized_lines(log: str) -> None:
    """Every recorded log of every tested build (b10950 to b11549, text and JSONL, -lv 3 to 5,
    router mode): each line of the server's loggers is read, or ignored by name."""
    results = [p._parse_line(line) for line in (LOGS / log).read_text(errors="replace").splitlines()]
    assert not [r for r in results if isinstance(r.event, p.Unrecognized)]


@pytest.mark.parametrize("log", sorted(str(f.relative_to(LOGS)) for f in LOGS.rglob("*.log")))
def test_the_one_match_path_reads_every_recorded_line_as_the_general_path_does(log: str) -> None:
    lines = (LOGS / log).read_text(errors="replace").splitlines()
    general = [p._parse_general(line) for line in lines]
    assert [p._parse_line(line) for line in lines] == general
    # both readers of the usual line, whichever this package uses: by character (compiled) and
    # by one regular expression (the interpreter); each reads the line as the general path or
    # leaves it to it, and the usual shape is read by both
    for read in (p._usual_line, p._usual_line_by_regex):
        for line, expected in zip(lines, general, strict=True):
            if "\ufffd" in line or "\x00" in line or "\x1b" in line:
                continue  # _parse_line sends these to the general path before either reader
            got = read(line)
            assert got is None or got == expected, (read.__name__, line)
            if p._usual_line(line) is not None:
                assert got is not None, (read.__name__, line)


@pytest.mark.parametrize("log", ["lv4-np2-text.log", "lv4-np2-jsonl.log", "lv3-np2-text.log"])
def test_every_request_of_a_recorded_log_launches_one_task(log: str) -> None:
    """One request task per response the client got (these workloads send n = 1)."""
    results = [p.parse_line(line) for line in (LOGS / log).read_text(errors="replace").splitlines()]
    launched = sum(isinstance(r.event, p.TaskLaunched) and not r.event.is_child for r in results)
    assert launched == len((LOGS / log.replace(".log", ".truth.jsonl")).read_text().splitlines())


def test_bytes_that_are_not_text_are_unreadable_not_ignored() -> None:
    """100 non-UTF-8 lines and random bytes: counted as unreadable (the parse-drift alert sees
    them), never as ignored (known but unneeded)."""
    import random

    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.pipeline import Pipeline
    from llamacpp_exporter.sources.lines import LineSplitter

    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    splitter = LineSplitter(pl, 1 << 20)
    splitter.feed(b"".join(b"\xff\xfe latin-1 caf\xe9 line %d\n" % i for i in range(100)))
    rng = random.Random(3)
    splitter.feed(bytes(rng.getrandbits(8) for _ in range(200_000)) + b"\n")
    splitter.feed(b"0.01.000.000 I srv  llama_server: a real line\n")

    def count(result: str) -> float:
        return value(pl.registry, "llamacpp_exporter_log_lines_total", {"result": result})

    total = sum(count(r) for r in ("parsed", "ignored", "unrecognized", "unreadable", "oversized"))
    # short runs of random bytes can be plain ASCII text by chance: those few read as text
    random_lines = total - 100 - 1
    assert count("unreadable") >= 100 + 0.97 * random_lines and count("ignored") <= 0.03 * random_lines
    assert total == count("unreadable") + count("ignored") + count("parsed") + count("unrecognized")
    assert not isinstance(p.parse_line("0.00.001.000 I srv  llama_server: tab\there").event, p.Unreadable)


ROUTER_LOG = Path(__file__).resolve().parent / "fixtures" / "logs" / "router-two-models.log"


def test_router_lines_name_the_child_and_its_model() -> None:
    # recorded: a llama-server router with two presets (tests/fixtures/logs/router-two-models.log)
    events = [p.parse_line(line.rstrip("\n")) for line in ROUTER_LOG.open()]
    own = [e.event for e in events if e.child is None and not isinstance(e.event, p.Ignored)]
    assert p.RouterStarted() in own
    assert [e for e in own if isinstance(e, p.ModelAvailable)] == [p.ModelAvailable("alpha"), p.ModelAvailable("beta")]
    spawned = [e for e in own if isinstance(e, p.ChildSpawned)]
    assert [e.name for e in spawned] == ["alpha", "beta"]
    ports = {e.port for e in spawned}
    assert {e.child for e in events if e.child is not None} == ports
    assert sum(isinstance(e, p.ChildExited) and e.status == 0 for e in own) == 2
    # each child's own lines parse as a plain server's, its clock its own
    child = [e for e in events if e.child == spawned[0].port]
    assert isinstance(child[0].event, p.ServerStarting) and child[0].ts_us is not None and child[0].ts_us < 10_000


def test_router_names_in_client_driven_lines_are_only_read_as_names() -> None:
    # invented lines, shaped like server-models.cpp's: the conv_id is the client's, never kept
    line = "0.03.000.000 I srv    operator(): request for conv_id=zebra secret cancelled while model name=alpha was loading"
    assert p.parse_line(line).event == p.ModelRequestCancelled("alpha")
    assert p.parse_line("0.03.000.000 I srv          join: request for name=beta queued at position 2").event == (
        p.ModelRequestQueued("beta")
    )
    # a prefix of more than five digits is no router's port
    assert p.parse_line("[1234567] 0.00.000.815 I srv  llama_server: initializing ...").child is None


@pytest.mark.parametrize(
    "line,expected",
    [
        # recorded: b11434 with a draft model (-md, --spec-type draft-simple), a request with the adapter
        (
            "0.04.504.121 I slot print_timing: id  1 | task 9 | draft acceptance = 0.87179 (   34 accepted /    39 generated), mean len =  7.80",
            p.DraftAcceptance(1, 9, 34, 39),
        ),
        # recorded: b11434, the tiny llama model, -c 256 --context-shift, a long answer
        (
            "0.00.477.196 W slot   operator(): id  0 | task 101 | slot context shift, n_keep = 1, n_left = 254, n_discard = 127",
            p.ContextShift(0, 101, 127),
        ),
    ],
)
def test_draft_acceptance_and_context_shift_lines(line: str, expected: p.Event) -> None:
    assert p.parse_line(line).event == expected
    # the same lines reworded (invented): a build that changes them is seen, not ignored
    reworded = line.replace("accepted /", "accepted of").replace("n_discard", "discarded")
    assert isinstance(p.parse_line(reworded).event, p.Unrecognized)


def _listing_by_regex(msg: str) -> p.Event | None:
    """What the regular expressions alone make of a RAM-cache listing line's message."""
    if msg.startswith("   - prompt with length"):
        m = p._RE_CANDIDATE.match(msg)
        return p.CacheCandidate(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)) if m else None
    m = p._RE_ENTRY.match(msg)
    return p.CacheEntryListed(m.group(1), int(m.group(2)), float(m.group(4)), int(m.group(3))) if m else None


def _listing_by_character(msg: str) -> p.Event | None:
    """The reading by character alone (None: it leaves the line to the regular expression)."""
    if msg.startswith("   - prompt with length"):
        return p._candidate_line(msg)
    return p._entry_line(msg) if msg.startswith("   - prompt ") else None


def _recorded_listings() -> list[str]:
    out = set()
    for f in LOGS.rglob("*.log"):
        for line in f.read_text(errors="replace").splitlines():
            at = line.find(":    - prompt ")
            if at >= 0:
                out.add(line[at + 2 :])
    return sorted(out)


RECORDED_LISTINGS = _recorded_listings()


def test_listing_lines_read_by_character_as_by_regex() -> None:
    """Every entry and candidate line of every recorded log: the reading by character makes of it
    what the regular expression makes (and reads each of them)."""
    assert len(RECORDED_LISTINGS) > 100
    for msg in RECORDED_LISTINGS:
        assert _listing_by_character(msg) is not None, msg
        assert _listing_by_character(msg) == _listing_by_regex(msg), msg


@settings(max_examples=3000, deadline=None)
@given(
    st.sampled_from(RECORDED_LISTINGS or ["   - prompt 0x1: 1 tokens, checkpoints: 0, 0.1 MiB"]),
    st.lists(
        st.tuples(st.integers(0, 120), st.sampled_from(list("0123456789-.: ,_x(nil)aM\u0663\u00e9")), st.booleans())
    ),
)
def test_listing_lines_changed_anywhere_read_by_character_as_by_regex(
    msg: str, edits: list[tuple[int, str, bool]]
) -> None:
    """INVENTED: recorded listing lines with characters replaced or inserted anywhere (digits of
    another script, signs, points, spaces): the reading by character gives the regular
    expression's event, or leaves the line to it."""
    for at, ch, insert in edits:
        at = min(at, len(msg))
        msg = msg[:at] + ch + msg[at + (0 if insert else 1) :]
    fast = _listing_by_character(msg)
    assert fast is None or fast == _listing_by_regex(msg), msg
    if msg.startswith("   - prompt "):  # the parser's answer, whichever reads it
        assert p._srv_event(msg) == (_listing_by_regex(msg) or p.UNRECOGNIZED), msg


def test_a_decimal_read_by_character_is_the_float_float_reads() -> None:
    """INVENTED decimals of up to 18 digits, signed or not: the same double as float() (the
    digits over a power of ten, or float() itself past 15 digits), and where it ends."""
    import random

    rng = random.Random(55)
    for _ in range(100_000):
        whole = str(rng.randint(0, 10 ** rng.randint(1, 10)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 8)))
        text = ("-" if rng.random() < 0.2 else "") + whole + ("." + frac if frac else "")
        value, end = p._ascii_float(text + " MiB", 0)
        assert (end, repr(value)) == (len(text), repr(float(text))), text
    assert p._ascii_float("1. MiB", 0)[1] == -1 and p._ascii_float("- MiB", 0)[1] == -1


def test_numbers_longer_than_a_native_integer_are_read_as_the_general_path_reads_them() -> None:
    """Compiled, the readers by character count in 64-bit integers: any number of the prefix or of
    a listing line made 18 to 40 digits long (INVENTED edits of real lines) is read as the
    regular expressions read it, or left to them; none wraps around."""
    shapes = [  # real lines (lv4-np2-text.log, the many-slot runs)
        "0.13.964.349 I slot launch_slot_: id  0 | task 34 | processing task, is_child = 0",
        "0.00.577.250 I srv        update:    - prompt 0x5593369e7000:     255 tokens, checkpoints:  2,    10.265 MiB",
        "0.00.344.990 I srv          load:    - prompt with length     254, lcp =      12, f_keep = 0.047, f_sim = 0.047",
    ]
    for line in shapes:
        for m in re.finditer(r"\d+", line):
            for width in (18, 19, 20, 40):
                edited = line[: m.start()] + "9" * width + line[m.end() :]
                general = p._parse_general(edited)
                assert p._parse_line(edited) == general, edited
                for read in (p._usual_line, p._usual_line_by_regex):
                    got = read(edited)
                    assert got is None or got == general, (read.__name__, edited)
                msg = edited[edited.index(": ", 30) + 2 :]
                if msg.startswith("   - prompt "):
                    fast = _listing_by_character(msg)
                    assert fast is None or fast == _listing_by_regex(msg), msg
