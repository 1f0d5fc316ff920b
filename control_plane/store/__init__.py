"""Where the control plane keeps its state: in memory (embedded) or in Redis (cluster)."""
