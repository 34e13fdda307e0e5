import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """Takes over relay's Message: the table exists already (relay 0003 renamed it to chat_message)."""

    initial = True

    dependencies = [
        ("relay", "0003_message_moves_to_chat"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Message",
                    fields=[
                        ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ("seq", models.PositiveBigIntegerField()),
                        ("idem_key", models.CharField(max_length=128)),
                        ("text", models.TextField()),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "author",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="messages", to="relay.user"
                            ),
                        ),
                        (
                            "channel",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="messages", to="relay.channel"
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["channel", "seq"],
                        "constraints": [
                            models.UniqueConstraint(fields=("channel", "seq"), name="message_seq_unique_per_channel"),
                            models.UniqueConstraint(
                                fields=("channel", "author", "idem_key"), name="message_idem_key_unique"
                            ),
                        ],
                    },
                ),
            ],
        ),
    ]
