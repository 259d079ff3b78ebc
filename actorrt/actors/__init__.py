"""Actor machinery: mailboxes, request/reply, supervision, worker pools."""

from ._actor import Actor, ActorRef, ActorStatistics, Crash, open_actors

__all__ = ["Actor", "ActorRef", "ActorStatistics", "Crash", "open_actors"]
