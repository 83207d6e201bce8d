"""Running the whole system on one machine (``make run``)."""
