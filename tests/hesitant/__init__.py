"""A test-only app that holds a grace check between its reads, installed only by tests/hesitant_settings.py."""
