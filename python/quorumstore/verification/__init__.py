"""Jepsen-style verification: record client histories and check them.

`history` is the event model and its JSONL form, `recorder` records histories from
quorumstore's client and the official Oxia client, `linearizability` checks each
key against a register with Oxia's versions, and `completeness` checks the final
state for lost writes and duplicate applies. See docs/verification.md.
"""
