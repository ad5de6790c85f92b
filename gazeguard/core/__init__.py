"""Layer 1, core: errors, gaze samples, ring buffers, threads, chunking, sample order. Imports
nothing of gazeguard."""
