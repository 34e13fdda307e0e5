"""A test-only app that holds back a reconciliation's read, installed only by tests/laggy_settings.py."""
