"""Standard Webhooks signatures, made by the specification's own package (`standardwebhooks`)."""

from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook


def signed_headers(secret: str, webhook_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
    """The `webhook-id`, `webhook-timestamp` and `webhook-signature` headers of one attempt."""
    moment = (now or datetime.now(tz=UTC)).replace(microsecond=0)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": Webhook(secret).sign(webhook_id, moment, body),
        "content-type": "application/json",
    }
