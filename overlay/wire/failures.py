"""Why a request got no answer, as one typed value from where it arises to where it is shown.

A model node that cannot answer sends an error chunk whose ``ReplyChunk.failure`` is a
:class:`Failure` code (:data:`WIRE`); its ``error`` is the words for the user, never parsed. The
user's client (:class:`overlay.anon.client.AnonClient`) acts on the code (another node at once for
``BUSY``, none for ``INVALID``, failover otherwise) and raises an :class:`overlay.anon.client.AnonError`
whose ``kind`` is a :class:`Failure`, its own kinds included (``SILENT``, ``NO_PATHS``, ...).
Chat's exit status, the gateway's HTTP error and the auditor's verdict each map the kind with a
table; none of them reads the message.
"""

from __future__ import annotations

import enum


class Failure(enum.IntEnum):
    """What went wrong. ``NODE_ERROR``, ``BUSY``, ``INVALID`` and ``SPENT`` travel on the wire from
    a model node (:data:`WIRE`); the rest arise at the user's client."""

    NONE = 0  # no failure (a chunk of an answer)
    NODE_ERROR = 1  # the node failed (its engine, a model it does not serve, a forward): fail over
    BUSY = 2  # refused at capacity before any output: another node may take it at once
    INVALID = 3  # the request itself is refused (its parameters, its length): any node would refuse it
    ALL_BUSY = 4  # every node tried was busy
    SILENT = 5  # no reply in time
    LOST = 6  # the node is gone (its proxies say so, or the paths to it died)
    UNVERIFIED = 7  # a reply chunk failed its check and was discarded
    NO_MODEL_NODE = 8  # no model node listed, trusted or reachable for the model
    UNAUDITED = 9  # the model is not audited and the user did not opt in
    NO_PATHS = 10  # too few proxy paths
    OTHER = 11  # anything else (the message says what)
    QUOTA = 12  # the user's usage quota of the model is used up for now (nothing was sent; decision 0017)
    SPENT = 13  # the request's usage-quota token was redeemed before (decision 0017); from a node, like INVALID


#: The codes a model node may put in an error chunk.
WIRE = frozenset({Failure.NODE_ERROR, Failure.BUSY, Failure.INVALID, Failure.SPENT})


def from_wire(code: int) -> Failure:
    """The failure an error chunk's code stands for: a code a node may not send (0, a client-side
    kind, an unknown number from a newer or hostile node) counts as ``NODE_ERROR``: the client
    fails over, as for any node fault."""
    try:
        kind = Failure(code)
    except ValueError:
        return Failure.NODE_ERROR
    return kind if kind in WIRE else Failure.NODE_ERROR
