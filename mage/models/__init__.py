"""Loading the base model and a run's policy, and the backend that generates with it."""
