"""A test-only app whose frame and event handlers fail, installed only by tests/faulty_settings.py."""
