"""The inference engine: layered energies, phases and solvers shared by every energy-based rule."""
