"""Tiny HTTP servers on 127.0.0.1 for the client's tests over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

#: what a server does with one connection
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests = 0
        self.url = ""

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.requests += 1
        try:
            await self.handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            w.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Server:
        s = Server(handler)
        srv = await asyncio.start_server(s.handle, "127.0.0.1", 0)
        servers.append(srv)
        s.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        return s

    yield start
    for srv in servers:
        srv.close()
        await srv.wait_closed()
