"""adaptdl_core.ports: the store's port is held from the moment it is picked until replica
0's store listens on it, in this process or in a launcher's child."""

import errno
import os
import socket
import subprocess
import sys
import time

import pytest

from adaptdl_core import collective, context, launch, ports


def _bind_fails(port):
    """True if binding ``port`` on 127.0.0.1 fails with EADDRINUSE (someone holds it)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
            return True
    return False


def _refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_held_port_cannot_be_taken_and_refuses_connections_until_closed():
    held = ports.HeldPort()
    assert _bind_fails(held.port) and _refused(held.port)
    held.close()
    assert held.closed and not _bind_fails(held.port)
    held.close()  # (twice is harmless)
    with pytest.raises(ValueError, match=f"port {held.port} is no longer held here"):
        held.fileno()


def test_replica_0_in_this_process_listens_on_the_held_socket():
    port = ports.HeldPort().keep_for_store()
    collective.initialize(master_port=port, replica_rank=0, num_replicas=1, timeout=5)
    try:
        assert collective.store_address() == ("127.0.0.1", port)
        assert context.current().held_port is None  # handed over, once
        assert not _refused(port)  # the store listens on it
    finally:
        collective.teardown()
    assert not _bind_fails(port)  # the store's end released it


def test_a_port_held_for_another_store_is_released_not_used():
    other = ports.HeldPort()
    other.keep_for_store()
    assert ports.take_for_store(other.port + 1) is None  # (the store binds its own)
    assert other.closed and not _bind_fails(other.port)
    assert context.current().held_port is None


def test_keeping_another_port_releases_the_first_and_reset_releases_the_last():
    first, second = ports.HeldPort(), ports.HeldPort()
    first.keep_for_store()
    second.keep_for_store()
    assert first.closed and not second.closed
    context.reset()
    assert second.closed


def test_an_inherited_socket_is_named_by_the_variable_and_checked(monkeypatch):
    # As a launcher's child finds it: a bound socket that only the variable names.
    held = ports.HeldPort()
    port = held.port
    monkeypatch.setenv(ports.FD_VARIABLE, str(held.detach()))
    with pytest.raises(ValueError, match=f"bound to port {port}, but the store's port is 1"):
        ports.take_for_store(1)
    assert not _bind_fails(port)  # closed, not kept
    assert ports.FD_VARIABLE not in os.environ  # handed over once, even when refused
    for bad, word in (("x", "is not an integer"), ("-1", "ADAPTDL_MASTER_FD")):
        monkeypatch.setenv(ports.FD_VARIABLE, bad)
        with pytest.raises(ValueError, match=word):
            ports.take_for_store(1)
    with open(__file__) as not_a_socket:
        monkeypatch.setenv(ports.FD_VARIABLE, str(not_a_socket.fileno()))
        with pytest.raises(ValueError, match="is not an open socket"):
            ports.take_for_store(1)


def test_an_inherited_socket_for_the_port_is_the_stores(monkeypatch):
    held = ports.HeldPort()
    port = held.port
    monkeypatch.setenv(ports.FD_VARIABLE, str(held.detach()))
    collective.initialize(master_port=port, replica_rank=0, num_replicas=1, timeout=5)
    try:
        assert collective.store_address() == ("127.0.0.1", port)
        assert ports.FD_VARIABLE not in os.environ
    finally:
        collective.teardown()
    assert not _bind_fails(port)


def test_start_replicas_hands_the_held_port_to_rank_0_only(tmp_path):
    # Each replica prints its variables and sleeps: while they run, the master port is
    # held (by rank 0's inherited socket, the launcher's copy closed), and only rank 0
    # was given it.
    script = ("import os, sys, time; print(os.environ.get('ADAPTDL_MASTER_FD'), "
              "os.environ['ADAPTDL_MASTER_PORT'], flush=True); time.sleep(30)")
    procs = launch.start_replicas([sys.executable, "-c", script], 2, capture_output=True)
    try:
        lines = [proc.stdout.readline().split() for proc in procs]
        port = int(lines[0][1])
        assert _bind_fails(port), "the master port is free while the job starts"
        assert lines[0][0] != "None" and lines[1] == ["None", str(port)], lines
        procs[0].kill()
        procs[0].wait()
        deadline = time.monotonic() + 10
        while _bind_fails(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _bind_fails(port)  # rank 0 held the only copy
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert [proc.returncode for proc in procs] == [-9, -9]
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # (nothing left behind)
