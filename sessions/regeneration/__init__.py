"""Regeneration jobs: a chat dataset's assistant turns rewritten by the target through its own
``/v1/chat/completions`` (SpecForge's ``regenerate_train_data.py`` layout, resumable by row id)."""
