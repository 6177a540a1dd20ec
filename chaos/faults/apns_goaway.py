"""apns-goaway: APNs sends GOAWAY after N streams per connection."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import simulator_fault

start = fault(
    "apns-goaway",
    "APNs sends GOAWAY after N streams per connection",
    required=("after_streams",),
    needs="apns_url",
    needs_what="APNs simulator",
)(simulator_fault("apns", "goaway"))
