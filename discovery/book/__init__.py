"""The lease book's contract (contract.py), the rules both stores apply
(rules.py) and the JSON views the API serves (views.py). The stores live
beside it, one package each: discovery.sqlite (one service, state in memory,
SQLite as its durable log) and discovery.postgres (replicas sharing one
database). The HTTP layer, the hot path and the status page know this
package only."""
