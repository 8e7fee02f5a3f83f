"""adaptdl_ray: Ray adapters for adaptdl_core (Ray Tune scheduler and distributed trainable)."""
