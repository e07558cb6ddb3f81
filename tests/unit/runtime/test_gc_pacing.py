"""The broker process's collector pacing (runtime/gc_pacing.py)."""

from __future__ import annotations

import asyncio
import gc

from danube_zmq.runtime.gc_pacing import GcPacer


def test_the_pacer_freezes_what_survived_and_thaws_on_its_interval() -> None:
    """Starting freezes every object alive (out of full collections' reach); each
    interval freezes what survived since; past the thaw interval everything is
    unfrozen and collected once, so a cycle that became garbage among frozen
    objects is freed at the thaw."""

    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    async def run() -> tuple[int, int, int]:
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle: only the collector frees it
        pacer = GcPacer(freeze_interval_s=0.01, thaw_interval_s=3600)
        pacer.start()
        frozen_at_start = gc.get_freeze_count()
        del a, b
        gc.collect()
        alive_while_frozen = sum(1 for o in gc.get_objects() if type(o) is Node)
        gc.unfreeze()  # the frozen generation is not part of get_objects: count it too
        alive_while_frozen += sum(1 for o in gc.get_objects() if type(o) is Node)
        gc.freeze()
        pacer.thaw_interval_s = 0.0
        while pacer.thaws == 0:
            await asyncio.sleep(0.01)
        await pacer.stop()
        gc.unfreeze()  # counted as they are: no collection of the test's own
        return frozen_at_start, alive_while_frozen, sum(1 for o in gc.get_objects() if type(o) is Node)

    try:
        frozen_at_start, alive_while_frozen, alive_after_thaw = asyncio.run(run())
    finally:
        gc.unfreeze()
    assert frozen_at_start > 0
    assert alive_while_frozen == 2  # frozen: the cycle survives a full collection
    assert alive_after_thaw == 0
