"""A test-only app that loses every pub/sub notice, installed only by tests/lossy_settings.py."""
