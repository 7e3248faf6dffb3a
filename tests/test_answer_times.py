"""When the answers a prompt holds existed (attribution.AnswerTimes): INVENTED sequences of
``init sampler`` lines and releases, the log's time stepping back a little now and then as it
may within a process."""

from __future__ import annotations

import random

from llamacpp_exporter.assemble.attribution import MAX_TWINS, AnswerTimes
from llamacpp_exporter.assemble.join import Holds


def every_twin(
    sampled: dict[int, tuple[int, int]], state: dict[int, int], held: tuple[tuple[int, int], ...]
) -> Holds | None:
    """The bound and owners by looking at every task kept: the earliest answer among each held
    task's twins (same prompt, still running or an answer as long), the longest held exchange's
    twins its owners, none named past MAX_TWINS."""
    bound, longest, owners = None, 0, set()
    for task, tokens in held:
        if task not in sampled or task not in state or not sampled[task][0] < tokens <= state[task]:
            continue
        twins = [
            t for t in sampled if sampled[t][0] == sampled[task][0] and (t == task or state.get(t, tokens) >= tokens)
        ]
        first = min(sampled[t][1] for t in twins)
        bound = first if bound is None else max(bound, first)
        if tokens > longest:
            longest, owners = tokens, set(twins)
        elif tokens == longest:
            owners.update(twins)
    if bound is None:
        return None
    return Holds(bound, () if len(owners) > MAX_TWINS else tuple(sorted(owners)))


def test_the_earliest_twin_and_the_owners_as_every_task_kept_says() -> None:
    rng = random.Random(55)
    for _ in range(200):
        answers = AnswerTimes()
        sampled: dict[int, tuple[int, int]] = {}
        state: dict[int, int] = {}
        now = 0
        for task in range(rng.randint(1, 60)):
            now += rng.choice([-300, -5, 0, 10, 1000, 50_000])  # a step back now and then
            prompt = rng.choice([10, 20]) if rng.random() < 0.8 else rng.randint(1, 40)
            answers.sampling(task, prompt, now)
            sampled[task] = (prompt, now)
            running_now = sorted(set(sampled) - set(state))
            for running in rng.sample(running_now, min(len(running_now), rng.randint(0, 2))):
                tokens = sampled[running][0] + rng.randint(1, 8)
                answered = now + rng.randint(0, 20_000) if rng.random() < 0.8 else None
                answers.ended(running, tokens, answered)
                state[running] = tokens
                if answered is not None:
                    sampled[running] = (sampled[running][0], max(sampled[running][1], answered))
        for _ in range(10):
            held = tuple(
                (t, sampled[t][0] + rng.randint(0, 9)) for t in rng.sample(sorted(sampled), min(2, len(sampled)))
            )
            assert answers.holds(held) == every_twin(sampled, state, held)


def test_past_max_twins_a_held_exchange_names_no_owner() -> None:
    answers = AnswerTimes()
    for task in range(MAX_TWINS + 1):
        answers.sampling(task, 10, 1000 * task)
        answers.ended(task, 15, 1000 * task + 500)
    assert answers.holds(((3, 15),)) == Holds(500, ())
    answers = AnswerTimes()
    for task in range(MAX_TWINS):
        answers.sampling(task, 10, 1000 * task)
        answers.ended(task, 15, 1000 * task + 500)
    assert answers.holds(((3, 15),)) == Holds(500, tuple(range(MAX_TWINS)))
