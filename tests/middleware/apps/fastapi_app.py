"""A FastAPI (Starlette) app with a planted slow path, served by uvicorn in the tests."""

from fastapi import FastAPI, Request
from planted import answer_ad, answer_item

import sampler
import sampler.middleware

sampler.start_from_env()

app = FastAPI()
app.add_middleware(sampler.middleware.ASGIMiddleware)  # the one line


@app.get("/items/{item_id}")
async def item(item_id: int, request: Request):
    answer_item(request.headers.get("x-plant"), item_id)
    return {"item": item_id}


@app.get("/ads/{slot}")
async def ad(slot: int, request: Request):
    answer_ad(request.headers.get("x-plant"))
    return {"ad": slot}
