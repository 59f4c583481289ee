"""Small Textual views: each takes an immutable snapshot from `sessions/` and draws it."""
