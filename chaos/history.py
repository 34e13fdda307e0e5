"""The history of a run: one JSON object per line, every time in seconds since the run began.

Record kinds (field `k`):

- `meta`: the seed, the wall-clock time the run began (`wall`), the presence timings, the command
  that replays the run, and the world: each tenant's users and channels and the memberships at
  the start.
- `open` / `close`: a client's connection attempt (`conn`, `tenant`, `user`, `instance`, `cursor`)
  and its end (`code`, `by`: `client` when the client closed it, `server` when it saw a close,
  `error` when the attempt failed).
- `recv` / `send`: one frame (`frame`) a connection received or sent.
- `member`: a membership change through the API (`op` add or remove, `status`, start `t`, `t_end`).
- `fault`: one nemesis action (`fault`, `target`, start `t`, `t_end`).
- `checkpoint`: the moment a quiet phase ended (everything healed and idle for the settle time).
- `log`: an instance log line that carries a traceback (`instance`, `text`).
- `end`: the run's end.
"""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class HistoryWriter:
    """Appends records to `history.jsonl`, stamping each with the run's monotonic time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("w")
        self._origin = time.monotonic()
        # The wall clock at the origin, to find a moment of the history in the instances' logs.
        self.wall_origin = time.time()
        self.count = 0

    def now(self) -> float:
        """Seconds since the run began (monotonic)."""
        return round(time.monotonic() - self._origin, 4)

    def write(self, kind: str, **fields: Any) -> float:
        """Write one record, timed now unless `t` is given; return its time."""
        fields.setdefault("t", self.now())
        self._file.write(json.dumps({"k": kind, **fields}, separators=(",", ":")) + "\n")
        self.count += 1
        return fields["t"]

    def close(self) -> None:
        self._file.close()


def history_file(path: Path) -> Path:
    """The history file of a run directory (or the file itself)."""
    return path / "history.jsonl" if path.is_dir() else path


def read(path: Path) -> Iterator[dict]:
    """Every record of a history, in the order written."""
    with history_file(path).open() as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)
