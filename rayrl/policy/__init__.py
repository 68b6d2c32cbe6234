"""Trained policies out of the platform: find a run's checkpoint, export it, play it."""
