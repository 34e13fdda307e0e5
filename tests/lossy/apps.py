"""Membership and rotation notices dropped on arrival, as pub/sub drops them while a subscriber reconnects.

Only the instance's reconciliation (relay/reconcile.py) is left to find the changes.
"""

from django.apps import AppConfig


class LossyConfig(AppConfig):
    name = "tests.lossy"
    label = "lossy"

    def ready(self) -> None:
        from relay import membership, reconcile

        def lost(self: object, message: dict) -> None:
            return None

        membership.MembershipBus.received = lost
        reconcile.Reconciler.notice_received = lost
