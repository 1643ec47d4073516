"""Test-bed utilities shared by ``tests/`` and ``benches/`` (which never import each other).

Child processes (a free port, a SIGTERM-then-SIGKILL stop, their RSS) and a real slow link (a
network namespace behind a shaped veth pair). Not part of the installed package.
"""
