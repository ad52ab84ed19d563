"""The simulator: the real `Scheduler` on a virtual clock (simulator.py), its named scenarios, and N engines
behind R routers on paper (cluster.py)."""
