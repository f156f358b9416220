"""Forks a child while sampling: both keep serving their own, separate profiles."""

import json
import os
import sys
import time
import urllib.request

import sampler


def spin_parent():
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        pass


def spin_child():
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        pass


def profile(url):
    with urllib.request.urlopen(url + "/profile.json", timeout=10) as r:
        return json.loads(r.read())


s = sampler.start(port=sys.argv[1], engine=sys.argv[2] if len(sys.argv) > 2 else "auto")
spin_parent()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    spin_child()
    me = sampler.running()
    os.write(write, json.dumps(profile(me.url)).encode())
    os.close(write)
    os._exit(0)
os.close(write)
chunks = []
while chunk := os.read(read, 1 << 20):
    chunks.append(chunk)
os.waitpid(pid, 0)
child = json.loads(b"".join(chunks))
parent = profile(s.url)
print(json.dumps({"parent": parent, "child": child}))
sampler.stop()
