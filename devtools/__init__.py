"""What a developer runs, not what Relay serves: `make run`, the embedded Redis, `manage.py test`."""
