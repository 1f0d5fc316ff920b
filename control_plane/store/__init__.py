"""Where the control plane keeps its state: in SQLite or memory (embedded) or in Redis (cluster)."""
