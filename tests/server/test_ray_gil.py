"""Ray's wait for the GCS port file leaves the GIL to other threads (issue 18: the start-up signal freeze).

Ray's own ``wait_for_persisted_port`` polls for the file in C++ holding the GIL, so a dead GCS froze every other
thread of the driver for 30 s; :mod:`~server.internals.ray_port_wait` waits with the GIL released, then lets Ray
read the file.
"""

import threading

import pytest
from ray._raylet import get_port_filename, persist_port, wait_for_persisted_port

from server.internals import ray_port_wait as ray_gil

NODE_ID = "ab" * 28


def test_another_thread_runs_while_the_port_is_awaited(tmp_path):
    waiting = threading.Event()

    def port_filename(node_id, port_name):  # called as the wait starts
        waiting.set()
        return get_port_filename(node_id, port_name)

    def gcs():  # stands for the GCS: it can only write its port once the waiting thread lets it run
        waiting.wait()
        persist_port(str(tmp_path), NODE_ID, "gcs_server_port", 4321)

    writer = threading.Thread(target=gcs, daemon=True)
    writer.start()
    wait = ray_gil.releasing_gil(wait_for_persisted_port, port_filename)
    assert wait(str(tmp_path), NODE_ID, "gcs_server_port", 60_000) == 4321
    writer.join()


def test_a_port_that_never_comes_gives_rays_own_error(tmp_path):
    wait = ray_gil.releasing_gil(wait_for_persisted_port, get_port_filename)
    with pytest.raises(RuntimeError, match="Timed out waiting for file"):
        wait(str(tmp_path), NODE_ID, "gcs_server_port", 200, 50)


def test_install_replaces_rays_start_up_wait_once():
    import ray._private.node as node

    ray_gil.install()
    patched = node.wait_for_persisted_port
    ray_gil.install()
    assert node.wait_for_persisted_port is patched and patched.releases_gil
