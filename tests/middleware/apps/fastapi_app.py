"""A FastAPI (Starlette) app with a planted slow path, served by uvicorn in the tests."""

import time

from fastapi import FastAPI, Request

import sampler
import sampler.middleware

sampler.start_from_env()

app = FastAPI()
app.add_middleware(sampler.middleware.ASGIMiddleware)  # the one line


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


@app.get("/items/{item_id}")
async def item(item_id: int, request: Request):
    plant = request.headers.get("x-plant")
    if plant == "slow":
        planted_slow_path(item_id)
    elif plant == "block":
        planted_blocking_call()
    else:
        work(0.0005)
    return {"item": item_id}


@app.get("/ads/{slot}")
async def ad(slot: int, request: Request):
    if request.headers.get("x-plant") == "hold":
        work(0.015)
    else:
        work(0.0003)
    return {"ad": slot}
