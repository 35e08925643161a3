"""verify-attention harness: bundles, oracle, implementations, parity, timing, sweeps, reports, compare."""
