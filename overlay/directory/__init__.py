"""The directory: who is on the network, as the verifier committee says (docs/committee.md).

- :mod:`~overlay.directory.rpc`: the one client of a verifier's CometBFT RPC (HTTP transport,
  ``abci_query``, ``broadcast_tx_sync``/``broadcast_tx_commit``).
- :mod:`~overlay.directory.registration`: the registration transaction codec (nodes sign with it,
  verifiers decode with it) and a node's registration driver.
- :mod:`~overlay.directory.work`: the registration's proof of work.
- :mod:`~overlay.directory.lists`: the committee's signed user and model lists: format,
  verification and the refreshing client.
- :mod:`~overlay.directory.registry`: the registry object nodes route with (a static file's, or
  the signed lists').
- :mod:`~overlay.directory.membership`: a node's membership, live: registers, follows the lists.
- :mod:`~overlay.directory.donation`, :mod:`~overlay.directory.transcripts`: what users hand the
  committee by consent (prompts, committed transcripts).
- :mod:`~overlay.directory.escrow`: weighted verifiable secret sharing among the committee's
  validators (decision 0037, proposed: its first brick; nothing calls it yet).

The numbers and names it shares with every layer (roles, the reputation scale and trust line,
...) are in :mod:`overlay.wire.constants`.
"""
