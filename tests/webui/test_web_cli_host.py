"""`fleetflame web --host` beyond loopback refuses to serve profiles with no authentication
(issue 14, defect 12), as the sampler's endpoint and the attach agent do; a token, or the
explicit --allow-unauthenticated, lets it start."""

import http.client
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def web(tmp_path, *args):
    port = free_port()
    command = [sys.executable, "-m", "webui", "--port", str(port)]
    command += ["--database-url", f"sqlite:///{tmp_path / 'fleetflame.db'}", *args]
    return port, subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def answers(port, process, headers=None):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/flamegraph?from=bad", headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            error.close()
            return error.code
        except (OSError, http.client.HTTPException):  # see mwhelpers.sampler_urls
            time.sleep(0.2)
    return None


@pytest.mark.parametrize("host", ["0.0.0.0", "127.evil.example"])
def test_an_open_host_without_authentication_is_refused(tmp_path, host):
    # A name that only starts like a loopback address once passed for one.
    _, process = web(tmp_path, "--host", host)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert host in err and "no authentication" in err and "--allow-unauthenticated" in err


def test_a_token_or_the_explicit_flag_lets_it_serve(tmp_path):
    # A bad parameter's 400 is an answer of the app itself, once past authentication.
    for args, headers, expected in (
        (("--auth-token", "s3cret-token"), {"Authorization": "Bearer s3cret-token"}, 400),
        (("--auth-token", "s3cret-token"), {}, 401),
        (("--allow-unauthenticated",), {}, 400),
    ):
        port, process = web(tmp_path, "--host", "0.0.0.0", *args)
        try:
            assert answers(port, process, headers) == expected
        finally:
            process.terminate()
            _, err = process.communicate(timeout=30)
        if "--allow-unauthenticated" in args:
            assert "no authentication" in err


def test_a_port_out_of_range_is_refused(capsys):
    # It listened on 99999 - 65536 while saying 99999 (found by a new-user walkthrough).
    from webui.cli import main

    for bad in ("99999", "-1"):
        with pytest.raises(SystemExit) as exit_:
            main(["--port", bad, "--database-url", "sqlite:///unused.db"])
        assert exit_.value.code == 2
        assert f"argument --port: invalid port value: '{bad}'" in capsys.readouterr().err


def test_the_request_log_has_no_terminal_colours_when_not_a_terminal(tmp_path):
    port, process = web(tmp_path)
    try:
        assert answers(port, process) == 400  # werkzeug colours a 400 red on a terminal
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert '"GET /api/flamegraph?from=bad HTTP/1.1" 400' in err and "\x1b[" not in err
