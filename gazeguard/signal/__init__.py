"""Layer 3, signal: events, features, their public bounds, label models and profiles: what gaze
becomes before anything is released. Imports core and privacy."""
