"""Samples of a Starlette app's handlers under the ASGI middleware carry their route's label.

    python routed_labels.py ENGINE PATH   (PATH: c, the middleware's C path, or python)

Two routes spin on the CPU, one of them inside a tag of its own; concurrent requests of both
interleave on the event loop. Prints the worker's /profile.json.
"""

import asyncio
import sys
import time
import urllib.request

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import sampler
import sampler.middleware
from sampler.middleware._asgi import PythonASGIMiddleware


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def report(request):
    for _ in range(10):
        spin(0.03)
        await asyncio.sleep(0)
    return PlainTextResponse(sampler.current_labels()["route"])


async def export(request):
    with sampler.tag(phase="write"):
        for _ in range(10):
            spin(0.03)
            await asyncio.sleep(0)
    return PlainTextResponse("ok")


async def main(middleware):
    import httpx

    app = Starlette(routes=[Route("/reports/{day}", report), Route("/export", export)])
    app.add_middleware(middleware)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = await asyncio.gather(*(client.get(p) for p in ["/reports/1", "/export"] * 3))
    assert [a.status_code for a in answers] == [200] * 6, answers


engine, path = sys.argv[1], sys.argv[2]
middleware = {"c": sampler.middleware.ASGIMiddleware, "python": PythonASGIMiddleware}[path]
s = sampler.start(port=0, engine=engine, driver="thread" if engine == "python" else "auto")
asyncio.run(main(middleware))
with urllib.request.urlopen(s.url + "/profile.json", timeout=10) as answer:
    sys.stdout.write(answer.read().decode())
sampler.stop()
