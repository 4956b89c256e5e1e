"""Actions that I/O-free cores return for their drivers to perform.

A core (``relay.RelayCore``, ``model_node.group.GroupState``) never touches a
socket: it returns a list of actions and its driver carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` to node ``peer`` (dialing it from the node's directory if needed)."""

    peer: bytes
    msg: Any
