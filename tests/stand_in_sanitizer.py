"""A stand-in for ``compute-sanitizer``, to test ``c128a sanitize``'s plumbing
on machines without CUDA: it takes the real one's options, runs the child
command after them, relays its output, and after the build markers of the
steps named in ``$STAND_IN_REPORT_AT`` (comma-separated indices) prints a
report shaped like memcheck's; its exit status is the real one's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

MARKER = "@@c128a-sanitize step "


def main(argv: list[str]) -> int:
    options, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        options[argv[i]] = argv[i + 1]
        i += 2
    report_at = {int(k) for k in os.environ.get("STAND_IN_REPORT_AT", "").split(",") if k}
    print("========= COMPUTE-SANITIZER", flush=True)
    child = subprocess.Popen(argv[i:], stdout=subprocess.PIPE, text=True)
    errors = 0
    for line in child.stdout:
        sys.stdout.write(line)
        if line.startswith(MARKER) and json.loads(line[len(MARKER):])["index"] in report_at:
            errors += 1
            print("========= Invalid __global__ read of size 4 bytes\n"
                  "=========     at c128a_wide_rows_kernel+0x1a0\n"
                  "=========     by thread (5,0,0) in block (0,0,0)\n"
                  "=========     Address 0x7f0000000040 is out of bounds\n"
                  "=========", flush=True)
    child.wait()
    print(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}", flush=True)
    if errors:
        return int(options["--error-exitcode"])
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
