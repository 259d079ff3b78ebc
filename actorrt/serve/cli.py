"""``actorrt serve``: the engine and the ASGI app on hypercorn's trio worker.

SIGINT / SIGTERM stop accepting connections; requests in flight get
``grace`` seconds to finish, then are cancelled; the process exits 0. A
second signal cancels at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Sequence

import trio

__all__ = ["serve", "serve_main", "add_arguments", "DEFAULT_GRACE_S"]

#: seconds requests in flight get to finish after SIGINT / SIGTERM
DEFAULT_GRACE_S = 10.0


def _model_id(model: str) -> str:
    p = Path(model)
    if p.suffix == ".gguf" or p.exists():
        return p.stem if p.suffix == ".gguf" else p.name
    return model


async def serve(model: str = "smollm2", *, host: str = "127.0.0.1", port: int = 8000,
                max_batch: int = 16, kv_budget_bytes: int | None = None,
                api_key: str | None = None, max_queue: int | None = None,
                grace_s: float = DEFAULT_GRACE_S, accuracy_level: int | None = None,
                kv_dtype: str | None = None, shutdown: trio.Event | None = None,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``model`` over HTTP until ``shutdown`` is set (or the task is
    cancelled); ``task_status.started`` gets the bound URL
    (``"http://127.0.0.1:PORT"``; ``port=0`` picks a free port).

    Raises:
        ModelLoadError: the model cannot be prepared or loaded.
        InvalidArgumentError: a bad option.
        OSError: the address cannot be bound.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from ..genai.engine import open_engine
    from .app import DEFAULT_MAX_QUEUE, create_app

    if shutdown is None:
        shutdown = trio.Event()
    async with open_engine(model, max_batch=max_batch, kv_budget_bytes=kv_budget_bytes,
                           accuracy_level=accuracy_level, kv_dtype=kv_dtype) as engine:
        model_id = _model_id(str(model))
        app = create_app(engine, model_id=model_id, aliases=(str(model),), api_key=api_key,
                         max_queue=DEFAULT_MAX_QUEUE if max_queue is None else max_queue)
        state = app.app.state.server
        config = Config()
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.graceful_timeout = grace_s
        config.accesslog = None
        config.errorlog = logging.getLogger("actorrt.serve")

        async def stopped() -> None:
            await shutdown.wait()
            state.closing = True

        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: hypercorn_serve(app, config, shutdown_trigger=stopped,
                                                    task_status=task_status))
            task_status.started(binds[0])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="'smollm2', a llama-family .gguf, or a prepared model folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument("--max-batch", type=int, default=16, help="most requests decoding at once")
    p.add_argument("--kv-budget", type=int, default=None, metavar="BYTES",
                   help="most KV-cache bytes of admitted requests (default: unlimited)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests that may wait beyond --max-batch before 429 (default 64)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="S",
                   help="seconds in-flight requests get after SIGINT/SIGTERM")
    p.add_argument("--accuracy-level", type=int, choices=(0, 4), default=None,
                   help="MatMulNBits accuracy_level of the graph to run (see generate)")
    p.add_argument("--kv-dtype", choices=("float32", "float16"), default=None,
                   help="KV cache element type (float16: half the bytes a token). "
                        "Default: float16 at accuracy level 4, float32 at level 0")


def _check(args: argparse.Namespace) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port must be in [0, 65535], got {args.port}"
    if args.max_batch < 1:
        return f"--max-batch must be >= 1, got {args.max_batch}"
    if args.kv_budget is not None and args.kv_budget < 1:
        return f"--kv-budget must be >= 1 byte, got {args.kv_budget}"
    if args.max_queue is not None and args.max_queue < 0:
        return f"--max-queue must be >= 0, got {args.max_queue}"
    if args.api_key is not None and not args.api_key.strip():
        return "--api-key must not be empty"
    if not args.grace >= 0:
        return f"--grace must be >= 0, got {args.grace}"
    return None


def serve_main(args: argparse.Namespace) -> int:
    """Run the server until SIGINT / SIGTERM; 0 after a clean stop, 1 on an
    actorrt error (one ``error:`` line), 2 on a bad option."""
    from .._errors import ActorRTError, leaf_exceptions

    problem = _check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    async def main() -> None:
        shutdown = trio.Event()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def watch() -> None:
                    async for sig in signals:
                        if shutdown.is_set() or not serving.is_set():
                            print("actorrt serve: stopping now", file=sys.stderr, flush=True)
                            nursery.cancel_scope.cancel()
                            return
                        print(f"actorrt serve: {signal.Signals(sig).name}: no new connections;"
                              f" waiting up to {args.grace:g} s for requests in flight",
                              file=sys.stderr, flush=True)
                        shutdown.set()

                async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    await serve(args.model, host=args.host, port=args.port,
                                max_batch=args.max_batch, kv_budget_bytes=args.kv_budget,
                                api_key=args.api_key, max_queue=args.max_queue,
                                grace_s=args.grace, accuracy_level=args.accuracy_level,
                                kv_dtype=args.kv_dtype, shutdown=shutdown,
                                task_status=task_status)
                    nursery.cancel_scope.cancel()  # drained: stop the signal watcher

                serving = trio.Event()
                nursery.start_soon(watch)
                url = await nursery.start(run_server)
                serving.set()
                print(f"actorrt serve: {_model_id(args.model)} on {url}", flush=True)

    try:
        trio.run(main)
    except BaseException as exc:  # noqa: BLE001 - classified below, others re-raised
        leaves = leaf_exceptions(exc)
        errors = [e for e in leaves if isinstance(e, (ActorRTError, OSError))]
        if errors and len(errors) == len(leaves):
            print(f"error: {errors[0]}", file=sys.stderr)
            return 1
        if all(isinstance(e, KeyboardInterrupt) for e in leaves):
            return 0
        raise
    print("actorrt serve: stopped", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="actorrt serve")
    add_arguments(p)
    return serve_main(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
