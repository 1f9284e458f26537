"""The decoder's parts, one registry family per file."""
