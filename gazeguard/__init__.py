"""gazeguard: a differential-privacy sidecar for eye-tracking streams.

LSL gaze in → events → sliding-window features → power-of-two chunks → DCFPA (or LPA/FPA/CFPA)
→ durable ε ledger → MQTT. Raw gaze never leaves the process.
"""

__version__ = "0.1.0"
