"""A client connected over stdio to one of tests/fixtures/mcp's servers.

The MCP tests (test_extra_mcp.py, test_extra_mcp_tasks.py) start their fixture
server as a subprocess of this interpreter, initialize a ``ClientSession`` on it,
and bound every wait; this is that setup, once.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def server_params(script: Path, env: Mapping[str, str]) -> StdioServerParameters:
    """How to start ``script`` with this interpreter and exactly ``env``."""
    return StdioServerParameters(command=sys.executable, args=[str(script)], env=dict(env))


@asynccontextmanager
async def connected(script: Path, env: Mapping[str, str]) -> AsyncIterator[ClientSession]:
    """An initialized client of ``script``; the server stops when the block ends."""
    async with stdio_client(server_params(script, env)) as (r, w), ClientSession(r, w) as client:
        await client.initialize()
        yield client


def run_with_server(script: Path, env: Mapping[str, str],
                    body: Callable[[ClientSession], Awaitable[None]], wait: float) -> None:
    """Run ``body`` against a fresh server, failing if it takes over ``wait`` seconds."""
    async def main() -> None:
        async with connected(script, env) as client:
            with anyio.fail_after(wait):
                await body(client)
    anyio.run(main)
