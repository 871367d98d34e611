"""The coordinator server: cluster metadata, elections and health, around the engine
in quorumstore.protocol.coordinator."""
