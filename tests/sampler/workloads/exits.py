"""A script that checks its arguments and exits with a status of its choosing."""

import sys
import time


def busy_for_a_while():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass


if __name__ == "__main__":
    assert sys.argv[1:3] == ["--flag", "value"], sys.argv
    busy_for_a_while()
    sys.exit(int(sys.argv[3]))
