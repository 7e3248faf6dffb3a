"""Which LoRA adapters each task ran with, from llama-server's endpoints.

The log never names a request's adapters: `/slots` shows a running task's `lora` list and
`/lora-adapters` the global scales that an empty list leaves in force. Both are kept per task
(bounded) so that a finished request, and the RAM-cache entry it restored, can be compared the
way the server compares them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Final, TypeVar

from ..records import LoraState

Scales = tuple[tuple[int, float], ...]  # (adapter id, scale)
TaskKey = tuple[int, int]  # (epoch, task)
T = TypeVar("T")

MAX_TASKS: Final = 4096


class LoraTracker:
    """Request lists (from /slots) and the global scales each task launched with.

    A request without a list runs with the global scales in force at its launch
    (launch_slot_with_task copies them). The log's ``set lora adapter`` lines (-lv 4) change them
    at their exact place; a /lora-adapters poll only says what they are when it ran, so a task
    launched around a poll that found them changed (or taken while the log was read from behind)
    is not known: its configuration stays "global".
    """

    def __init__(self) -> None:
        self.global_scales: Scales | None = None
        self._by_task: OrderedDict[TaskKey, Scales] = OrderedDict()
        # per task: the global scales at its launch and the /lora-adapters poll count then
        self._at_launch: OrderedDict[TaskKey, tuple[Scales | None, int]] = OrderedDict()
        self._polls = 0
        # polls that found the scales changed, or were taken while the log was read from behind
        self._unsettling: deque[int] = deque(maxlen=64)

    def global_scale_set(self, adapter: int, scale: float) -> None:
        """One adapter's global scale from the log (POST /lora-adapters logs each adapter's)."""
        scales = dict(self.global_scales or ())
        scales[adapter] = scale
        self.global_scales = tuple(sorted(scales.items()))

    def polled(self, scales: Scales, catching_up: bool) -> None:
        """A /lora-adapters answer. One that changed known scales leaves the tasks launched since
        the poll before it, and until the next one, unknown: the change came somewhere in between
        (and a launch line read just after the answer may have been written just before it).
        Scales first learnt while the log is read at its live end hold from here on."""
        self._polls += 1
        if catching_up or (self.global_scales is not None and scales != self.global_scales):
            self._unsettling.append(self._polls)
        self.global_scales = scales

    def new_process(self) -> None:
        """A restarted server has its own global scales (its command line's), not yet known."""
        self.global_scales = None

    def launched(self, key: TaskKey) -> None:
        _remember(self._at_launch, key, (self.global_scales, self._polls))

    def task_seen(self, key: TaskKey, scales: Scales) -> None:
        _remember(self._by_task, key, scales)

    def of_task(self, key: TaskKey | None) -> Scales | None:
        return self._by_task.get(key) if key is not None else None

    def config_of(self, key: TaskKey | None, request: Scales | None) -> str | None:
        """The effective configuration a task ran with, as llama-server compares it
        (are_lora_equal): a non-empty request list replaces the global scales (unlisted
        adapters get 0); an empty one leaves those at its launch in force ("global" while not
        known). None: the request list is not known."""
        if request is None:
            return None
        if request:
            return _config(dict(request))
        at = self._at_launch.get(key) if key is not None else None
        if at is None or at[0] is None or at[1] in self._unsettling or at[1] + 1 in self._unsettling:
            return "global"  # unknown, or launched between the poll before a change and the one after
        return _config(dict(at[0]))


def _remember(table: OrderedDict[TaskKey, T], key: TaskKey, value: T) -> None:
    table[key] = value
    table.move_to_end(key)
    if len(table) > MAX_TASKS:
        table.popitem(last=False)


def _config(scales: dict[int, float]) -> str:
    active = [f"{i}:{s:g}" for i, s in sorted(scales.items()) if s != 0.0]
    return ",".join(active) if active else "none"


def state(config: str | None) -> LoraState:
    """The lora label of an effective configuration (``LoraTracker.config``): active if any
    adapter ran with a non-zero scale. A request without a ``lora`` list runs with the global
    scales (1.0 for each --lora, even with --lora-init-without-apply on the builds tested):
    unknown until /lora-adapters or the log has shown them."""
    if config is None or config == "global":
        return "unknown"
    return "none" if config == "none" else "active"
