"""Data files of the engine: the known-causes catalogue (``known_causes*.toml``)."""
