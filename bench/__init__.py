"""The benchmark harness: `make bench` / `make bench-quick` (see docs/performance.md)."""
