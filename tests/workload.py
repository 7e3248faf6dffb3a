"""Client workloads against a real llama-server, recording each response's ground truth.

The prompt text is synthetic (words drawn from a fixed list by a seeded generator) and
every prompt carries CANARY, so tests can prove no prompt text leaks into the exporter's
output.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

CANARY = "quokkacanary"
WORDS = (
    "river mountain lantern copper violet harbor meadow signal orbit candle timber falcon "
    "granite willow ember quartz shadow thunder compass velvet anchor prairie glacier beacon "
    "saddle orchard cobalt marble thistle canyon pepper lagoon cedar walnut saffron tundra"
).split()

LORA_ACTIVE = [{"id": 0, "scale": 0.5}]


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + f" {CANARY}."


@dataclass
class Truth:
    """One response: what was sent and the server's own timings."""

    conv: str
    turn: int
    lora: str  # "active" or "none": what the request asked for
    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    t_start: float
    t_end: float


def completion(client: httpx.Client, prompt: str, lora: bool, n_predict: int = 4) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": True, "temperature": 0}
    if lora:
        body["lora"] = LORA_ACTIVE
    r = client.post("/completion", json=body, timeout=120)
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def seed_scenario(url: str, seed: int = 7, then_lora: bool = True) -> list[Truth]:
    """The seed's three requests on one slot: A with LoRA, B without, A + more with LoRA (or,
    ``then_lora`` False, without: A's restored entry was computed under another adapter)."""
    rng = random.Random(seed)
    a = text(rng, 130)
    b = text(random.Random(seed + 1), 110)
    more = text(rng, 3)
    out: list[Truth] = []
    with httpx.Client(base_url=url) as c:
        for conv, prompt, lora in (("A", a, True), ("B", b, False), ("A", a + " " + more, then_lora)):
            t0 = time.time()
            res = completion(c, prompt, lora)
            out.append(_truth(conv, len(out), lora, res["timings"], t0))
    return out


def _truth(conv: str, turn: int, lora: bool, t: dict[str, Any], t0: float) -> Truth:
    return Truth(
        conv,
        turn,
        "active" if lora else "none",
        int(t["cache_n"]),
        int(t["prompt_n"]),
        float(t["prompt_ms"]),
        int(t["predicted_n"]),
        float(t["predicted_ms"]),
        t0,
        time.time(),
    )


def lora_plan(conv: int, turn: int) -> bool:
    """Even conversations use the adapter, odd ones do not; the last one alternates, so
    its restored entries were computed under the other configuration."""
    if conv == 5:
        return turn % 2 == 1
    return conv % 2 == 0


def _chat(
    url: str,
    name: str,
    system: str,
    turns: int,
    max_tokens: int,
    lora_for_turn: Callable[[int], list[dict[str, Any]] | None],
    rng: random.Random,
    results: list[Truth],
    lock: threading.Lock,
    *,
    send_id: bool = True,
    delay: float = 0.0,
    user_words: tuple[int, int] = (20, 60),
    pause: tuple[float, float] = (0.1, 0.8),
) -> None:
    """One multi-turn conversation on /v1/chat/completions; appends each turn's ground truth.
    lora_for_turn(turn) gives the request's `lora` list or None."""
    messages = [{"role": "system", "content": system}]
    headers = {"X-Conversation-Id": name} if send_id else {}
    with httpx.Client(base_url=url, headers=headers) as c:
        time.sleep(delay)
        for turn in range(turns):
            messages.append({"role": "user", "content": text(rng, rng.randint(*user_words))})
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "cache_prompt": True}
            lora = lora_for_turn(turn)
            if lora:
                body["lora"] = lora
            t0 = time.time()
            r = c.post("/v1/chat/completions", json=body, timeout=600)
            r.raise_for_status()
            res = r.json()
            messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
            with lock:
                results.append(_truth(name, turn, bool(lora), res["timings"], t0))
            time.sleep(rng.uniform(*pause))


def chat_workload(
    url: str,
    n_convs: int = 6,
    turns: int = 4,
    seed: int = 11,
    max_tokens: int = 12,
    long_system: tuple[int, ...] = (0, 1),
) -> list[Truth]:
    """Concurrent multi-turn chats with X-Conversation-Id; two conversations carry a long
    (~1,200-token) system prompt of their own so the cache outcomes are counted."""
    results: list[Truth] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(conv: int) -> None:
        rng = random.Random(seed * 100 + conv)
        sys_words = 900 if conv in long_system else 20
        try:
            _chat(
                url,
                f"conv-{seed}-{conv}",
                f"conversation {conv}. " + text(rng, sys_words),
                turns,
                max_tokens,
                lambda turn: LORA_ACTIVE if lora_plan(conv, turn) else None,
                rng,
                results,
                lock,
                delay=0.3 * conv,
            )
        except BaseException as e:  # noqa: BLE001 - surfaced by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_convs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


LONG_CONV = "long-conversation"


@dataclass
class Contention:
    """What the contention workload sent besides the chats."""

    gave_up: int = 0  # clients that gave up while their request was queued
    probes: list[Truth] = field(default_factory=list)  # id-less health probes that completed
    slots_polls: int = 0  # GET /slots by another client


def _long_prefill_slot(client: httpx.Client, min_tokens: int) -> int | None:
    """The slot prefilling a prompt of at least min_tokens right now, per /slots."""
    for s in client.get("/slots", timeout=600).json():
        if s.get("is_processing") and (s.get("n_prompt_tokens") or 0) >= min_tokens:
            nd = s.get("next_token") or [{}]
            if not nd[0].get("n_decoded"):
                return int(s["id"])
    return None


def contention_workload(
    url: str,
    send_ids: bool = True,
    seed: int = 23,
    short_convs: int = 4,
    short_turns: int = 3,
    long_turns: int = 3,
    long_words: int = 1200,
) -> tuple[list[Truth], Contention]:
    """One long conversation (a long system prompt) that misses the cache on every turn (its
    client changes the LoRA scale each turn, so llama-server clears the cached state), next to
    short chats that decode while it prefills. Around them:
    - impatient clients: each waits until /slots shows the long prompt being prefilled, sends
      a chat request pinned to that slot (id_slot, no X-Conversation-Id) and gives up after
      0.3 s, while it is queued (the slot then still has the prefill's rest and 64 tokens to
      decode);
    - a health probe without an id: a tiny chat request every 1.5 s;
    - another client polling /slots every 0.25 s.
    Returns the chats' ground truth and what else was sent."""
    results: list[Truth] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    extra = Contention()
    done = threading.Event()

    def guarded(fn: Callable[..., object]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - surfaced by the caller
                errors.append(e)
                done.set()

        return run

    def chat(name: str, words: int, turns: int, max_tokens: int, lora_scales: list[float] | None, delay: float) -> None:
        rng = random.Random(f"{seed}-{name}")
        _chat(
            url,
            name,
            f"{name}. " + text(rng, words),
            turns,
            max_tokens,
            lambda turn: [{"id": 0, "scale": lora_scales[turn % len(lora_scales)]}] if lora_scales else None,
            rng,
            results,
            lock,
            send_id=send_ids,
            delay=delay,
            user_words=(15, 40),
            pause=(0.2, 0.6),
        )

    def impatient(n: int) -> None:
        rng = random.Random(f"{seed}-impatient")
        with httpx.Client(base_url=url) as c:
            for _ in range(n):
                slot = None
                while slot is None and not done.is_set():
                    slot = _long_prefill_slot(c, long_words)
                    time.sleep(0.05)
                if slot is None:
                    return
                # one token: if the server runs it anyway, its decoding overlaps nothing measurable
                body = {
                    "messages": [{"role": "user", "content": text(rng, 30)}],
                    "max_tokens": 1,
                    "temperature": 0,
                    "id_slot": slot,
                }
                try:
                    httpx.post(url + "/v1/chat/completions", json=body, timeout=0.3)
                except httpx.TimeoutException:
                    with lock:
                        extra.gave_up += 1
                while not done.is_set() and _long_prefill_slot(c, long_words) == slot:
                    time.sleep(0.1)  # the next one waits for the next long prefill

    def probe() -> None:
        with httpx.Client(base_url=url) as c:
            i = 0
            while not done.wait(1.5):
                i += 1
                t0 = time.time()
                body = {"messages": [{"role": "user", "content": f"health check {i}"}], "max_tokens": 2}
                r = c.post("/v1/chat/completions", json=body, timeout=600)
                r.raise_for_status()
                with lock:
                    extra.probes.append(_truth("", i, False, r.json()["timings"], t0))

    def slots_poller() -> None:
        with httpx.Client(base_url=url) as c:
            while not done.wait(0.25):
                c.get("/slots", timeout=600).raise_for_status()
                extra.slots_polls += 1

    chats = [threading.Thread(target=guarded(chat), args=(LONG_CONV, long_words, long_turns, 64, [0.5, 0.7], 0.0))]
    for i in range(short_convs):
        chats.append(
            threading.Thread(target=guarded(chat), args=(f"short-{i}", 60, short_turns, 48, None, 0.5 + 0.4 * i))
        )
    around = [
        threading.Thread(target=guarded(f), args=a) for f, a in ((impatient, (2,)), (probe, ()), (slots_poller, ()))
    ]
    for t in chats + around:
        t.start()
    for t in chats:
        t.join()
    done.set()
    for t in around:
        t.join()
    if errors:
        raise errors[0]
    return results, extra


def rotation_workload(
    url: str, returning: int, one_shots: int, rounds: int, seed: int, words: int = 1000
) -> list[Truth]:
    """Sequential chats with X-Conversation-Id: `returning` conversations take turns, each turn
    followed by `one_shots` conversations seen once. On one slot every new request saves the
    slot's state to the RAM cache; with a cache that holds about two prompts, three returning
    conversations are evicted before they come back (thrashing), while one returning
    conversation with one-shots between its turns keeps its entry and only one-shots are
    evicted (a full, healthy cache)."""
    rng = random.Random(seed)
    systems = {f"ret-{seed}-{i}": f"conversation {i}. " + text(rng, words) for i in range(returning)}
    history: dict[str, list[dict[str, Any]]] = {n: [{"role": "system", "content": s}] for n, s in systems.items()}
    out: list[Truth] = []
    one_shot_no = 0
    with httpx.Client(base_url=url) as c:

        def ask(name: str, messages: list[dict[str, Any]], turn: int) -> None:
            messages.append({"role": "user", "content": text(rng, 15)})
            body = {"messages": messages, "max_tokens": 4, "temperature": 0, "cache_prompt": True}
            t0 = time.time()
            r = c.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": name}, timeout=600)
            r.raise_for_status()
            res = r.json()
            messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
            out.append(_truth(name, turn, False, res["timings"], t0))

        for turn in range(rounds):
            for name, messages in history.items():
                ask(name, messages, turn)
                for _ in range(one_shots):
                    one_shot_no += 1
                    msgs = [{"role": "system", "content": f"one-shot {one_shot_no}. " + text(rng, words)}]
                    ask(f"once-{seed}-{one_shot_no}", msgs, 0)
    return out


def rewritten_history(
    url: str, seed: int = 31, turns: int = 7, rewrite_at: tuple[int, ...] = (3, 5)
) -> tuple[list[Truth], int]:
    """Two conversations taking turns on /v1/chat/completions (no LoRA). Before the turns in
    rewrite_at each drops its oldest exchange (a sliding-window client): the new prompt leaves
    the previous one right after the short system prompt. Returns the responses and how many
    requests had their history rewritten."""
    rngs = {name: random.Random(seed + i) for i, name in enumerate(("rw-a", "rw-b"))}
    history = {name: [{"role": "system", "content": "Answer briefly."}] for name in rngs}
    out: list[Truth] = []
    rewritten = 0
    clients = {name: httpx.Client(base_url=url, headers={"X-Conversation-Id": name}) for name in rngs}
    try:
        for turn in range(turns):
            for name, rng in rngs.items():
                messages = history[name]
                if turn in rewrite_at:
                    del messages[1:3]  # the oldest user message and its answer
                    rewritten += 1
                messages.append({"role": "user", "content": text(rng, rng.randint(120, 160))})
                body = {"messages": messages, "max_tokens": 8, "temperature": 0, "cache_prompt": True}
                t0 = time.time()
                r = clients[name].post("/v1/chat/completions", json=body, timeout=600)
                r.raise_for_status()
                res = r.json()
                messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
                out.append(_truth(name, turn, False, res["timings"], t0))
    finally:
        for c in clients.values():
            c.close()
    return out, rewritten


def impatient_ids_workload(
    url: str,
    seed: int = 7373,
    n_convs: int = 6,
    turns: int = 5,
    impatient: int = 12,
    apart: tuple[float, float] = (3.0, 6.0),
) -> tuple[list[Truth], int]:
    """Issue 18's multi-user server: six chat conversations that send X-Conversation-Id (the
    adapter on every other one, two with a long system prompt), and, beside them, short chat
    requests from other clients that also send an id (`impatient-N`), two thirds of which give
    up after 0.3 s or 1 s if no answer came (while queued, as a rule), `apart` seconds after the
    previous one's end (uniform). Returns the completed requests' ground
    truth (the chats' and the impatient ones answered in time) and how many gave up."""
    results: list[Truth] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    gave_up = [0]
    done = threading.Event()

    def conv(i: int) -> None:
        rng = random.Random(f"{seed}-{i}")
        try:
            _chat(
                url,
                f"conv-{seed}-{i}",
                f"conversation {i}. " + text(rng, 900 if i in (0, 3) else 60),
                turns,
                24,
                lambda turn: LORA_ACTIVE if i % 2 == 0 else None,
                rng,
                results,
                lock,
                delay=0.3 * i,
                user_words=(15, 40),
                pause=(0.0, 0.5),
            )
        except BaseException as e:  # noqa: BLE001 - surfaced by the caller
            errors.append(e)

    def impatient_clients() -> None:
        rng = random.Random(f"{seed}-impatient")
        for n in range(impatient):
            if done.wait(rng.uniform(*apart)):
                return
            name = f"impatient-{seed}-{n}"
            body = {"messages": [{"role": "user", "content": text(rng, 30)}], "max_tokens": 8, "temperature": 0}
            t0 = time.time()
            try:
                r = httpx.post(
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"X-Conversation-Id": name},
                    timeout=(0.3, 1.0, 600.0)[n % 3],  # a third of them wait for their answer
                )
                r.raise_for_status()
                with lock:
                    results.append(_truth(name, 0, False, r.json()["timings"], t0))
            except httpx.TimeoutException:
                with lock:
                    gave_up[0] += 1

    threads = [threading.Thread(target=conv, args=(i,)) for i in range(n_convs)]
    side = threading.Thread(target=impatient_clients)
    for t in [*threads, side]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    side.join()
    if errors:
        raise errors[0]
    return results, gave_up[0]


def saturating_workload(url: str, requests: int = 30, tokens: int = 256, apart: float = 0.1) -> list[Truth]:
    """More than a one-slot server serves: `requests` chat requests arriving `apart` seconds
    apart, each generating `tokens` tokens (end of sequence ignored), so that each waits behind
    all the earlier ones. Each sends an X-Conversation-Id (its arrival is then pinned in the
    log). Returns their ground truth."""
    results: list[Truth] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def one(i: int) -> None:
        rng = random.Random(f"saturate-{i}")
        body = {
            "messages": [{"role": "user", "content": text(rng, 40)}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        t0 = time.time()
        try:
            r = httpx.post(
                url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": f"busy-{i}"}, timeout=900
            )
            r.raise_for_status()
            with lock:
                results.append(_truth(f"busy-{i}", 0, False, r.json()["timings"], t0))
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = []
    for i in range(requests):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(apart)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def pileup_workload(
    url: str, seed: int = 4242, n_convs: int = 8, rounds: int = 4, impatient: int = 6
) -> tuple[list[Truth], int]:
    """Pile-ups: `n_convs` chat conversations with X-Conversation-Id (the adapter on every other
    one, two with a long system prompt) that send their turns together, round after round: each
    round starts once every conversation has its previous answer. Beside them, short chat requests
    of other clients with ids (`impatient-N`), two thirds of which give up after 0.3 s or 1 s.
    Returns the completed requests' ground truth and how many clients gave up."""
    results: list[Truth] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    gave_up = [0]
    barrier = threading.Barrier(n_convs)
    done = threading.Event()

    def conv(i: int) -> None:
        rng = random.Random(f"{seed}-{i}")
        name = f"pile-{seed}-{i}"
        messages = [{"role": "system", "content": f"conversation {i}. " + text(rng, 700 if i in (0, 5) else 40)}]
        try:
            with httpx.Client(base_url=url, headers={"X-Conversation-Id": name}) as c:
                for turn in range(rounds):
                    barrier.wait(timeout=900)
                    time.sleep(rng.uniform(0.0, 0.5))  # together, as people are: within half a second
                    messages.append({"role": "user", "content": text(rng, rng.randint(15, 40))})
                    body: dict[str, Any] = {"messages": messages, "max_tokens": 16, "temperature": 0}
                    if i % 2 == 0:
                        body["lora"] = LORA_ACTIVE
                    t0 = time.time()
                    r = c.post("/v1/chat/completions", json=body, timeout=900)
                    r.raise_for_status()
                    res = r.json()
                    messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
                    with lock:
                        results.append(_truth(name, turn, i % 2 == 0, res["timings"], t0))
        except BaseException as e:  # noqa: BLE001 - surfaced by the caller
            errors.append(e)
            barrier.abort()

    def impatient_clients() -> None:
        rng = random.Random(f"{seed}-impatient")
        for n in range(impatient):
            if done.wait(rng.uniform(2.0, 5.0)):
                return
            name = f"impatient-{seed}-{n}"
            body = {"messages": [{"role": "user", "content": text(rng, 30)}], "max_tokens": 8, "temperature": 0}
            t0 = time.time()
            try:
                r = httpx.post(
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"X-Conversation-Id": name},
                    timeout=(0.3, 1.0, 900.0)[n % 3],
                )
                r.raise_for_status()
                with lock:
                    results.append(_truth(name, 0, False, r.json()["timings"], t0))
            except httpx.TimeoutException:
                with lock:
                    gave_up[0] += 1

    threads = [threading.Thread(target=conv, args=(i,)) for i in range(n_convs)]
    side = threading.Thread(target=impatient_clients)
    for t in [*threads, side]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    side.join()
    if errors:
        raise errors[0]
    return results, gave_up[0]
