"""Two phases of CPU work, one after the other: which period files hold which tells whether
each file has its own period's samples or the cumulative counts."""

import sys
import time


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def phase_one(seconds):
    spin(seconds)


def phase_two(seconds):
    spin(seconds)


if __name__ == "__main__":
    seconds = float(sys.argv[1])
    phase_one(seconds)
    phase_two(seconds)
