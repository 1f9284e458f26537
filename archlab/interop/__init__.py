"""Bridges to other model libraries; each imports its library only when called (optional extras)."""
