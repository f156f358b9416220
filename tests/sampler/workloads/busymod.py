"""A module run with -m."""

import time


def module_work():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass


if __name__ == "__main__":
    module_work()
