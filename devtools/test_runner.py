"""`python manage.py test` hands over to pytest, so operators and CI run one suite."""

import sys

import pytest


class PytestRunner:
    """A TEST_RUNNER that runs the pytest suite with the labels as pytest arguments."""

    def __init__(self, verbosity: int = 1, failfast: bool = False, keepdb: bool = False, **kwargs) -> None:
        self.verbosity = verbosity
        self.failfast = failfast
        self.keepdb = keepdb

    def run_tests(self, test_labels: list[str], **kwargs) -> int:
        """Run pytest and return its exit code as the number of failures Django expects."""
        argv = list(test_labels)
        if self.verbosity == 0:
            argv.append("--quiet")
        elif self.verbosity > 1:
            argv.append("--verbose")
        if self.failfast:
            argv.append("--exitfirst")
        if self.keepdb:
            argv.append("--reuse-db")
        code = pytest.main(argv)
        # Django exits with bool(failures); pytest's "no tests collected" (5) is a failure too.
        sys.stdout.flush()
        return int(code)
