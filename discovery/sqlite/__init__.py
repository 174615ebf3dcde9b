"""The lease book on embedded SQLite: one service, its state in memory, the
file its durable log (book.py, store.py)."""
