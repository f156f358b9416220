"""Stalls in real servers under load: a planted 100 ms blocking call is found, every time.

Flask under gunicorn (sync, and gthread with four threads) and FastAPI under uvicorn serve a
load generator's requests; 1 in 40 calls ``planted_blocking_call`` (``time.sleep(0.1)`` in the
request: in an async handler it blocks the event loop). With no change to the apps beyond
``sampler.start_from_env()``, each worker's /stalls.json must hold one stall for each planted
call, of the right kind and thread, lasting 100 ms to within 20%, its stacks showing the planted
call; and no stall for the fast requests.
"""

import pytest
from mwhelpers import gunicorn, has_frame, load, uvicorn

PLANTED = 0.1


def plan(count, every=40):
    return [(f"/items/{i}", "block" if i % every == every // 2 else "") for i in range(count)]


def check_stalls(documents, sent, kind):
    assert all(s.status == 200 for s in sent)
    planted = [s for s in sent if s.plant == "block"]
    stalls = [st for document in documents for st in document["stalls"] if st["kind"] == kind]
    found = [st for st in stalls if has_frame(st["stacks"]["wall"], "planted_blocking_call")]
    assert len(found) == len(planted), [(st["what"], st["duration"]) for st in stalls]
    # Nothing else stalled: a fast request is 0.5 ms (a loaded machine may stretch one, so a
    # stray stall or two is allowed, never one per request).
    assert len(stalls) - len(found) <= 2, [(st["what"], st["duration"]) for st in stalls]
    for stall in found:
        assert stall["duration"] == pytest.approx(PLANTED, rel=0.2), stall["what"]
    if kind == "request":  # gunicorn says which request it was
        paths = {st["what"].rsplit(" ", 1)[-1] for st in found}
        assert paths == {s.path for s in planted}, paths
    # The load generator waited at least as long for each planted request.
    assert all(s.latency >= PLANTED for s in planted)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("worker_class, threads", [("sync", 1), ("gthread", 4)])
def test_a_blocking_call_in_a_gunicorn_worker_is_a_request_stall(worker_class, threads):
    server = gunicorn(
        "flask_app:app", worker_class, 1, threads, FLEETFLAME_REQUEST_STALL_THRESHOLD="0.08"
    )
    try:
        sent = load(server.port, plan(400), concurrency=threads)
        found = check_stalls(server.stalls_documents(), sent, "request")
    finally:
        server.stop()
    if worker_class == "gthread":  # the worker's request threads, not the main thread
        assert all(st["thread"] != "MainThread" for st in found)


@pytest.mark.slow
def test_a_blocking_call_in_an_async_handler_is_an_event_loop_stall():
    server = uvicorn("fastapi_app:app")
    try:
        sent = load(server.port, plan(400), concurrency=1)
        found = check_stalls(server.stalls_documents(), sent, "event-loop")
    finally:
        server.stop()
    assert all(st["thread"] == "MainThread" for st in found)
