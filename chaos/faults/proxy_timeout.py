"""proxy-timeout: a named dependency black-holed: data stops flowing and connections hang
(timeout toxic; timeout_ms 0 holds them until the fault stops), the failure a client's own
timeout must catch. params: {proxy, timeout_ms}."""

from __future__ import annotations

from chaos.faults import NAMED_PROXY, fault
from chaos.faults.adapters import proxy_toxic

start = fault(
    "proxy-timeout",
    "a named dependency black-holed: connections hang (timeout toxic)",
    needs="toxiproxy_url",
    needs_what="fault proxy (a proxies: map in the target file, or toxiproxy_url)",
    required=("proxy",),
    takes_away=NAMED_PROXY,
)(proxy_toxic("timeout", lambda p: {"timeout": int(p.get("timeout_ms", 0))}))
