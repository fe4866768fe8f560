"""Production (chapter 08): batching policies measured and simulated, a fleet under an autoscaler,
rollouts, cold starts, monitoring, cost and the deploy manifests."""
