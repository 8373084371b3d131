"""Paper reproductions and analyses built on the library: lifted-network tables, filter pictures,
γ sweeps, Morpho-MNIST attributes. Not part of the core API."""
