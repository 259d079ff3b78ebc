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
