"""Layer 5, wire: the published payloads (chunk, status, label, cohort, attention, cohort
receipt), their schemas and topics, and the egress contract that classifies every published field
public or released (:mod:`gazeguard.wire.egress`)."""
