"""Which LoRA adapters each task ran with, from llama-server's endpoints.

The log never names a request's adapters: `/slots` shows a running task's `lora` list and
`/lora-adapters` the global scales that an empty list leaves in force. Both are kept per task
(bounded) so that a finished request, and the RAM-cache entry it restored, can be compared the
way the server compares them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from ..records import LoraState

Scales = tuple[tuple[int, float], ...]  # (adapter id, scale)
TaskKey = tuple[int, int]  # (epoch, task)

MAX_TASKS: Final = 4096


class LoraTracker:
    def __init__(self) -> None:
        self.global_scales: Scales | None = None
        self._by_task: OrderedDict[TaskKey, Scales] = OrderedDict()

    def task_seen(self, key: TaskKey, scales: Scales) -> None:
        self._by_task[key] = scales
        self._by_task.move_to_end(key)
        if len(self._by_task) > MAX_TASKS:
            self._by_task.popitem(last=False)

    def of_task(self, key: TaskKey | None) -> Scales | None:
        return self._by_task.get(key) if key is not None else None

    def config(self, request: Scales | None) -> str | None:
        """Effective adapter configuration, as llama-server compares it (are_lora_equal).

        A non-empty request list replaces the global scales (unlisted adapters get 0);
        an empty one leaves the global list in force.
        """
        if request is None:
            return None
        scales: dict[int, float]
        if request:
            scales = dict(request)
        elif self.global_scales is not None:
            scales = dict(self.global_scales)
        else:
            return "global"
        active = [f"{i}:{s:g}" for i, s in sorted(scales.items()) if s != 0.0]
        return ",".join(active) if active else "none"


def state(request: Scales | None) -> LoraState:
    """The lora label: active if any adapter has a non-zero scale."""
    if request is None:
        return "unknown"
    return "active" if any(sc != 0.0 for _, sc in request) else "none"
