"""The Textual app, its screens and the `eagle3-tui` command line."""
