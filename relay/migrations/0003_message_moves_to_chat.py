from django.db import migrations


class Migration(migrations.Migration):
    """The Message model now belongs to the `chat` app: its table is renamed, its rows kept."""

    dependencies = [
        ("relay", "0002_message_and_channel_last_seq"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.AlterModelTable(name="message", table="chat_message")],
            state_operations=[migrations.DeleteModel(name="Message")],
        ),
    ]
