"""The lease book on PostgreSQL: replicas sharing one database, which holds
the state (book.py, store.py); each replica probes its share of the fleet
(prober.py, sharing.py)."""
