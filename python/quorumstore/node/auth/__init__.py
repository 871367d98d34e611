"""Who may call a node's client port, and what each caller may do (docs/security.md)."""
