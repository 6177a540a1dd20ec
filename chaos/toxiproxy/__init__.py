"""A TCP fault proxy with Toxiproxy 2.x's HTTP API, so that the same chaos scripts (and the
PyPI client ``toxiproxy-python``) drive a real Toxiproxy in staging and this one on a laptop.

* :mod:`chaos.toxiproxy.toxics`: the toxics (latency, bandwidth, slow_close, timeout,
  reset_peer, slicer, limit_data, noop), each acting on one direction's chunk stream;
* :mod:`chaos.toxiproxy.proxy`: listeners, connections and live toxic chains;
* :mod:`chaos.toxiproxy.api`: the HTTP API, :class:`~chaos.toxiproxy.api.ToxiproxyServer`
  (in-process) and :func:`~chaos.toxiproxy.api.serve` (foreground process);
* :mod:`chaos.toxiproxy.client`: a small typed client for what ``toxiproxy-python`` lacks.

Run it: ``python -m chaos.toxiproxy --host 127.0.0.1 --port 8474``.
"""
