"""Layer 9, offline: evaluation, dataset releases, recordings, replay and the demo."""
