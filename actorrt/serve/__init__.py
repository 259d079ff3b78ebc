"""An OpenAI-compatible HTTP server over the generation engine
(``actorrt serve``).

Map:

* :mod:`.protocol`: the OpenAI wire format: request bodies checked into typed
  requests (400 naming the field), response / chunk / error JSON;
* :mod:`.metrics`: the Prometheus metrics (one registry per app);
* :mod:`.app`: the Starlette ASGI app (:func:`create_app`): routes, auth,
  admission (429), one engine stream per choice, SSE, disconnects;
* :mod:`.cli`: ``actorrt serve``: open the engine, run the app on hypercorn's
  trio worker (:func:`serve`), SIGINT / SIGTERM graceful shutdown.

Everything runs on one trio loop: the engine actor, hypercorn and the
handlers (Starlette through anyio's trio backend).
"""

__all__ = ["create_app", "serve"]


def __getattr__(name: str):
    # lazy: ``actorrt --help`` / ``actorrt run`` never import starlette
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "serve":
        from .cli import serve
        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
