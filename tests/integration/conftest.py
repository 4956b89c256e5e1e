"""Fixtures for the integration tests; the network itself comes from :mod:`overlay.testing`
and :mod:`model_node.testing`. Tests that take ``autojump_clock`` run on trio's MockClock
(pytest-trio runs a test under the clock among its arguments)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from overlay.testing import Net


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery cancelled when the test ends (so the nodes started in it stop)."""
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


@pytest.fixture
def net() -> Net:
    """An empty in-memory network."""
    return Net()
