"""Audits of model nodes by the verifier committee (docs/committee.md "Audits", decisions 0010 and 0013).

- :mod:`.chain`: the audit's part of the committee state: per-verifier plan commits and reports,
  the per-node median, missed epochs, reputations (I/O-free, deterministic).
- :mod:`.tx`: the audit transactions' one codec.
- :mod:`.reputation`: the reputation rule in fixed point.
- :mod:`.scoring`: a reply's two-sided calibrated score from a verifier's teacher-forced pass.
- :mod:`.challenges`: challenge prompts and sampling parameters drawn like users' requests.
- :mod:`.pool`: prompts users donated (by consent) for challenges.
- :mod:`.corpus`: the verifier operator's private challenge prompts (``--challenge-prompts``).
- :mod:`.auditor`: a verifier's audit planner (I/O-free).
- :mod:`.loop`: its thin trio driver, the audit loop of ``gentorrent verifier --audit``.
- :mod:`.transcripts`: users' transcripts (decision 0015): the book, its rules, the scores' carry.
"""
