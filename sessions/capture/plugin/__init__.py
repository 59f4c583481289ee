"""The plugin's source folder: ``eagle3_capture/`` is copied, as is, into the generated PYTHONPATH dir."""
