"""The sans-I/O protocol core: replica and coordinator state machines.

Nothing in this package opens a socket or a file, starts a thread or reads a clock;
the node and coordinator servers (and the deterministic simulator) drive it.
"""
