"""The peer Relay is measured against: django-channels-presence-4-0, used as its documentation shows."""
