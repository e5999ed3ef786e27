"""Runs a command as the child of this small process and writes the command's own peak resident memory (KiB).

Linux carries a process's resident-memory high-water mark across exec (getrusage's ru_maxrss), so a program started
straight from a process that holds a model (a pytest worker, the benchmark) starts with that process's peak as its own:
libFuzzer's -rss_limit_mb reads it, and so does whoever measures the program's memory. Started from here, the program's
figure counts only its own pages. Used by tests/test_fuzz.py and benchmark/bench_real.py.

usage: python tools/own_peak_rss.py PEAK_KIB_FILE|- COMMAND [ARG...]   (exit status: the command's; 128+N on signal N)
"""

import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    peak_file, command = argv[1], argv[2:]
    pid = os.spawnvp(os.P_NOWAIT, command[0], command)
    _, status, usage = os.wait4(pid, 0)
    if peak_file != "-":
        with open(peak_file, "w") as f:
            f.write(str(usage.ru_maxrss))
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
