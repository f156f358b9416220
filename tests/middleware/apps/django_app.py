"""A one-file Django project with a planted slow path, served by gunicorn in the tests."""

import time

from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.http import JsonResponse
from django.urls import path

import sampler

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="test-only",
    MIDDLEWARE=["sampler.middleware.django.Middleware"],  # the one line
)
sampler.start_from_env()


def planted_slow_path():
    end = time.thread_time() + 0.06
    while time.thread_time() < end:
        pass


def item(request, item_id):
    if request.headers.get("X-Plant") == "slow":
        planted_slow_path()
    return JsonResponse({"item": item_id})


urlpatterns = [path("items/<int:item_id>", item)]
application = get_wsgi_application()
