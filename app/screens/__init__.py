"""The TUI's screens: the dashboard, the profile editor, help (diagnose and jobs come from their owners)."""
