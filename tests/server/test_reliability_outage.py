"""Reliability scenario 10: PostgreSQL goes away and comes back (a restart).

The shared PostgreSQL server is not restarted; the workers and an API server
reach it through a TCP proxy on loopback that the test stops (dropping every
connection and refusing new ones) and starts again. Workers must ride it out:
reconnect, record what they measured (or learn they lost the lease), finish
the job, and leave nothing RUNNING. The API answers 503 while the database is
away and recovers by itself.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import make_url
from svc_helpers import FAKE_ARGS, wait_for

from ws_tuner.store.queue import JobQueue

OUTAGE_S = 5.0


class TcpProxy:
    """A loopback TCP relay that can be cut (every connection dropped, new ones refused) and restored."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.mark.postgres
@pytest.mark.timeout(180)
@pytest.mark.parametrize("outage", [OUTAGE_S, pytest.param(30.0, marks=pytest.mark.slow)], ids=["5s", "30s"])
def test_postgres_restart(
    outage: float, pg_url: str, make_job: Callable, spawn_worker: Callable, live_server: Callable, open_db: Callable
) -> None:
    real = make_url(pg_url)
    proxy = TcpProxy((real.host or "127.0.0.1", real.port or 5432))
    proxy.start()
    via_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        job = make_job(pg_url, budget=40)
        queue = JobQueue(open_db(pg_url))  # the test's own view, not through the proxy
        live = live_server(via_proxy)
        workers = [spawn_worker(via_proxy, *FAKE_ARGS, "--runner-delay", "0.1", "--exit-when-idle", heartbeat=0.5, grace=3.0)
                   for _ in range(2)]  # fmt: skip
        wait_for(lambda: queue.get_job(job.id).search_counts.get("done", 0) >= 5, 60, 0.05, "the job to get going")

        proxy.stop()  # PostgreSQL "restarts"
        cut = time.monotonic()
        with live.client() as client:
            during = wait_for(lambda: (r := client.get("/ready")).status_code == 503 and r, 15, 0.2, "/ready to notice")
            assert during.json() == {"detail": "database unavailable"}
            assert client.get("/health").status_code == 200  # the process itself is alive
        time.sleep(max(outage - (time.monotonic() - cut), 0))
        assert all(w.poll() is None for w in workers), "a worker died during the outage"
        proxy.start()

        done = wait_for(lambda: (j := queue.get_job(job.id)).state == "succeeded" and j, 90, 0.2, "the job to finish")
        codes = [w.wait(60) for w in workers]
        assert codes == [0, 0], [w.log_path.read_text()[-2000:] for w in workers]
        trials, count = queue.job_trials(job.id, limit=500)
        assert count == 40 and {t.state for t in trials} == {"done"}  # nothing stuck RUNNING, nothing failed
        assert len({t.candidate_hash for t in trials}) == 40
        assert queue.store.status_counts(workload_id=done.workload_id) == {"ok": 40}
        logs = "".join(w.log_path.read_text() for w in workers)
        assert "database unavailable" in logs  # they did see the outage, and rode it out
        with live.client() as client:
            assert wait_for(lambda: client.get("/ready").status_code == 200, 30, 0.2, "/ready to recover")
    finally:
        proxy.stop()
