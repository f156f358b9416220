"""A WSGI app for gunicorn, instrumented by environment variables alone (FLEETFLAME_PORT=...)."""

import os
import time

import sampler

sampler.start_from_env()


def handle_request():
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass


def app(environ, start_response):
    handle_request()
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
