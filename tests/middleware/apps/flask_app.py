"""A Flask app with a planted slow path, served by gunicorn in the middleware tests."""

import flask
from planted import answer_ad, answer_item

import sampler
import sampler.middleware

sampler.start_from_env()

app = flask.Flask(__name__)
app.wsgi_app = sampler.middleware.WSGIMiddleware(app.wsgi_app)  # the one line


@app.route("/items/<int:item_id>")
def item(item_id):
    answer_item(flask.request.headers.get("X-Plant"), item_id)
    return {"item": item_id}


@app.route("/ads/<int:slot>")
def ad(slot):
    answer_ad(flask.request.headers.get("X-Plant"))
    return "ad"
