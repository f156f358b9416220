"""A Flask app with a planted slow path, served by gunicorn in the middleware tests."""

import time

import flask

import sampler
import sampler.middleware

sampler.start_from_env()

app = flask.Flask(__name__)
app.wsgi_app = sampler.middleware.WSGIMiddleware(app.wsgi_app)  # the one line


def work(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def planted_blocking_call():
    time.sleep(0.1)  # a blocking call: 100 ms of nothing, the worker (or the loop) held


def planted_slow_path(item_id):
    # 40 to 78 ms of CPU (4 samples or more at 100 Hz) in a shuffled order, so that the
    # slowest 1% is well defined: a tight cluster would sit on either side of its p99.
    end = time.thread_time() + 0.040 + 0.002 * (item_id // 50 * 7 % 20)
    while time.thread_time() < end:
        pass


def hold_the_worker():
    work(0.015)  # a huge record: the worker is busy 15 ms


@app.route("/items/<int:item_id>")
def item(item_id):
    plant = flask.request.headers.get("X-Plant")
    if plant == "slow":
        planted_slow_path(item_id)
    elif plant == "block":
        planted_blocking_call()
    else:
        work(0.0005)
    return {"item": item_id}


@app.route("/ads/<int:slot>")
def ad(slot):
    if flask.request.headers.get("X-Plant") == "hold":
        hold_the_worker()
    else:
        work(0.0003)
    return "ad"
