"""The console: read-only pages of what the conductor and its workers did, from the episode dataset."""
