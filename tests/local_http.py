"""A real HTTP server on a free local port for client tests: GET routes answered by the given handlers."""

from __future__ import annotations

import contextlib


@contextlib.asynccontextmanager
async def serving(routes: dict):
    """`async with serving({"/path": handler}) as base:` — base is "http://127.0.0.1:<port>"; aiohttp handlers."""
    from aiohttp import web

    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
    finally:
        await runner.cleanup()
