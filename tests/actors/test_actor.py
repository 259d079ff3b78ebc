"""Actors: request/reply, errors returned to the asker, supervision."""

import pytest
import trio

import actorrt
from actorrt.actors import Actor, Crash, open_actors


class Counter(Actor):
    def __init__(self):
        super().__init__("counter")
        self.n = 0
        self.stopped = False

    async def handle(self, message):
        if message == "inc":
            self.n += 1
            return self.n
        if message == "boom":
            raise ValueError("bad message")
        raise TypeError(message)

    async def on_stop(self):
        self.stopped = True


async def test_ask_tell_and_ordering():
    a = Counter()
    async with open_actors([a]) as (ref,):
        ref.tell("inc")
        assert await ref.ask("inc") == 2  # messages handled in order
    assert a.stopped


async def test_handler_error_goes_to_the_asker_and_actor_continues():
    a = Counter()
    async with open_actors([a]) as (ref,):
        with pytest.raises(ValueError, match="bad message"):
            await ref.ask("boom")
        assert await ref.ask("inc") == 1
        st = a.statistics()
        assert (st.handled, st.failed, st.alive) == (1, 1, True)


async def test_crashed_actor_is_broken_not_closed():
    a = Counter()
    async with open_actors([a]) as (ref,):
        ref.tell(Crash(RuntimeError("hardware fault")))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(actorrt.ProviderBrokenError) as ei:
            await ref.ask("inc")
        assert isinstance(ei.value.__cause__, RuntimeError)


async def test_closed_actor_raises_session_closed():
    a = Counter()
    async with open_actors([a]) as (ref,):
        pass
    with pytest.raises(actorrt.SessionClosedError):
        await ref.ask("inc")


class Maker(Actor):
    """Makes a 'resource' per request, slowly; counts what it made and what
    came back to it unclaimed."""

    def __init__(self):
        super().__init__("maker")
        self.made = []
        self.abandoned = []
        self.gate = trio.Event()

    def withdrawable(self, message):
        return message != "keep"

    def on_abandoned(self, message, value):
        self.abandoned.append(value)

    async def handle(self, message):
        if message == "slow":
            await self.gate.wait()
        self.made.append(message)
        return f"resource-{message}"


async def test_a_cancelled_ask_is_withdrawn_or_its_reply_handed_back():
    a = Maker()
    async with open_actors([a]) as (ref,):
        async with trio.open_nursery() as nursery:
            async def slow():
                with trio.move_on_after(0.05):
                    await ref.ask("slow")  # taken, then its asker gives up

            nursery.start_soon(slow)
            await trio.sleep(0.01)
            with trio.move_on_after(0.02):
                await ref.ask("queued")  # waits behind "slow": withdrawn
            with trio.move_on_after(0.02):
                await ref.ask("keep")  # not withdrawable: still handled
            with trio.move_on_after(0):
                await ref.ask("never-sent")  # a cancelled asker sends nothing
            await trio.sleep(0.1)
            a.gate.set()
        assert await ref.ask("after") == "resource-after"
    assert a.made == ["slow", "keep", "after"]
    assert a.abandoned == ["resource-slow", "resource-keep"]


async def test_provider_frees_allocations_its_cancelled_askers_never_took():
    from actorrt.providers.base import Allocate
    from actorrt.providers.cpu import CPUExecutionProvider

    p = CPUExecutionProvider(workers=1)
    async with p.open() as ref:
        for _ in range(50):
            with trio.move_on_after(0):
                await ref.ask(Allocate((1024,), 1))
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                async def one():
                    with trio.move_on_after(0.0001):
                        await ref.ask(Allocate((1024,), 1))
                nursery.start_soon(one)
        await trio.sleep(0.05)
        stats = p.statistics()
        assert stats.live_buffers == 0
        assert stats.memory.live_by_role["tensors"] == 0
