"""The lease book on PostgreSQL: replicas sharing one database, which holds
the state (book.py, store.py); one replica probes (leadership.py)."""
