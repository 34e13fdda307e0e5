"""`python -m chaos --seed N --minutes M` runs seeds; `python -m chaos check PATH` re-checks a history."""

import argparse
import json
import os
import secrets
import signal
import sys
from pathlib import Path


def prepare_environment() -> None:
    """What the instances and the shared test helpers need before anything imports Django."""
    # A SIGTERM unwinds like Ctrl-C, so the deployment's processes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
    os.environ.setdefault("SECRET_KEY", "chaos-" + secrets.token_urlsafe(48))
    # Every server is on loopback: a proxy from the environment must not see the clients' requests.
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), "127.0.0.1", "localhost"]))


def check(path: Path) -> int:
    from chaos import checker
    from chaos.history import read

    report = checker.check(list(read(path)))
    if report.violations:
        print(checker.describe(report, str(path)))
    print(json.dumps({"checks": report.checks, "violations": report.found}))
    return 1 if report.violations else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        parser = argparse.ArgumentParser(prog="python -m chaos check")
        parser.add_argument("path", type=Path, help="a run's directory (var/chaos/<seed>) or its history.jsonl")
        return check(parser.parse_args(argv[1:]).path)
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed on (default 1)")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of faults and operations per seed")
    parser.add_argument("--users", type=int, default=200, help="simulated users over both tenants")
    parser.add_argument("--out", type=Path, default=Path("var/chaos"), help="where each seed's run is kept")
    parser.add_argument("--faults", help="the fault kinds the nemesis picks from, comma-separated (default: all)")
    parser.add_argument("--results", type=Path, help="the summary (default bench/results/chaos-latest.json)")
    args = parser.parse_args(argv)
    prepare_environment()
    from chaos import checker
    from chaos.nemesis import FAULTS
    from chaos.run import RESULTS, run_seed, say, summarize

    faults = tuple(args.faults.split(",")) if args.faults else FAULTS
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    reports = []
    results = args.results or RESULTS
    results.parent.mkdir(parents=True, exist_ok=True)
    for seed in range(args.seed, args.seed + args.seeds):
        report = run_seed(seed, args.minutes, args.users, args.out, faults)
        reports.append(report)
        if report.violations:
            print(checker.describe(report, str(args.out / str(seed))))
        say(f"seed {seed}: {report.operations}, faults {report.faults}, violations {report.found}")
        # After every seed: a long run stopped early keeps the summary of the seeds it finished.
        results.write_text(json.dumps(summarize(reports, args.minutes, args.users), indent=2) + "\n")
    return 1 if any(report.violations for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
