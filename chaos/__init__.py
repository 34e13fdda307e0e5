"""Relay under random operations and random faults, held against its contract (docs/reliability.md).

`python -m chaos --seed N --minutes M` deploys three instances, Redis behind a fault proxy and a
database, drives a few hundred real WebSocket clients through connects, closes, resumes, sends
and membership changes while a nemesis injects faults, records every observation as a history,
and checks the history (chaos/checker.py). `python -m chaos check PATH` re-checks one offline.
"""
