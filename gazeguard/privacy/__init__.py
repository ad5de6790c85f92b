"""Layer 2, privacy: the accountant and the mechanisms (noise, transforms, sensitivities, exact
samplers). Imports core only."""
