"""The shared store's SQL, one statement per operation where it can be.

Time: `{NOW}` is the store's clock, the database's `now()` unless a clock
was given (tests: the same fake clock the SQLite book gets). Fleet: every
statement on a lease or a proxy names this replica's fleet (`%(fleet)s`, a
digest; fleet.py), so a replica never acts on a proxy its fleet lacks.

Rules are the book's (discovery/book/rules.py): statements take what it
decided (a TTL, a cooldown's target and end) as parameters and read what it
decides on. ELIGIBLE is the one place SQL applies a rule, since the grant's
pick must filter in the database: rules.eligible over the fields of
rules.Eligibility, which come as parameters."""

from __future__ import annotations

NOW = "COALESCE(%(now)s::timestamptz, now())"
EPOCH = "extract(epoch from {})::float8"

# A proxy of this replica's fleet that the selector matches (over discovery_proxies p).
MINE = "%(fleet)s = ANY(p.fleets)"
SELECTED = f"""{MINE}
      AND (%(provider)s::text IS NULL OR p.provider = %(provider)s)
      AND (%(zone)s::text IS NULL OR p.zone = %(zone)s)
      AND p.labels @> %(labels)s::jsonb"""
# ...and could be granted now: rules.eligible (healthy, no live lease, no
# live cooldown under the grant's scopes, the selector matching).
ELIGIBLE = f"""p.health = 'healthy' AND {SELECTED}
      AND (p.lease_expires IS NULL OR p.lease_expires <= {NOW})
      AND NOT EXISTS (SELECT 1 FROM discovery_cooldowns c
                      WHERE c.proxy = p.name AND c.target = ANY(%(scopes)s)
                        AND c.until > {NOW})"""

LEASE_COLUMNS = f"""l.id, l.proxy, l.holder, l.target, l.ttl,
    {EPOCH.format("l.granted_at")} AS granted_at, {EPOCH.format("l.expires_at")} AS expires_at"""
# The lease's proxy is in this replica's fleet.
LEASE_IS_MINE = f"EXISTS (SELECT 1 FROM discovery_proxies p WHERE p.name = l.proxy AND {MINE})"

# One round trip for a batch of grants that ask the same of a proxy (the
# eligibility parameters), each its own lease id, holder, target and TTL
# (arrays, in the batch's order): the least recently used eligible proxies
# (the lease contract's order, which the index discovery_proxies_lru keeps),
# locked (rows another grant holds are skipped: it is taking them), marked
# used and leased, the first to the first grant of the batch. Fewer eligible
# than asked: the last grants get none (no row for their id). Whether a proxy
# is free is a column of its own row (lease_expires), not a lookup in the
# lease table: a row another grant just took comes back to this one's lock as
# its new version, and PostgreSQL checks the condition again on that, so a
# proxy leased meanwhile is passed over (and the next one taken) instead of
# picked. An expired lease of it may still be in the lease table: replaced in
# place (and said so: `replaced` counts it as expired); a live one is never
# touched.
GRANT = f"""WITH wanted AS (
        SELECT * FROM unnest(%(ids)s::text[], %(holders)s::text[], %(targets)s::text[],
                             %(ttls)s::float8[])
            WITH ORDINALITY AS w(id, holder, target, ttl, n)),
    picked AS (
        SELECT free.name,
               row_number() OVER (ORDER BY free.last_used ASC NULLS FIRST, free.name) AS n
        FROM (SELECT p.name, p.last_used FROM discovery_proxies p
              WHERE {ELIGIBLE}
              ORDER BY p.last_used ASC NULLS FIRST, p.name
              LIMIT cardinality(%(ids)s::text[]) FOR UPDATE OF p SKIP LOCKED) free),
    used AS (
        UPDATE discovery_proxies p
        SET last_used = {NOW}, lease_expires = {NOW} + make_interval(secs => w.ttl)
        FROM picked JOIN wanted w USING (n)
        WHERE p.name = picked.name
        RETURNING p.name, w.id, w.holder, w.target, w.ttl)
    INSERT INTO discovery_leases AS l (id, proxy, holder, target, ttl, granted_at, expires_at)
    SELECT used.id, used.name, used.holder, used.target, used.ttl, {NOW},
           {NOW} + make_interval(secs => used.ttl)
    FROM used
    ON CONFLICT (proxy) DO UPDATE SET id = excluded.id, holder = excluded.holder,
        target = excluded.target, ttl = excluded.ttl, granted_at = excluded.granted_at,
        expires_at = excluded.expires_at
    WHERE l.expires_at <= {NOW}
    RETURNING {LEASE_COLUMNS}, l.xmax::text <> '0' AS replaced"""

# An eligible proxy no other grant holds right now, locked for this one.
ONE_FREE = f"""SELECT p.name FROM discovery_proxies p WHERE {ELIGIBLE}
    LIMIT 1 FOR UPDATE OF p SKIP LOCKED"""

# A live lease of this fleet, locked (changes to one lease, and so reports on
# one proxy, take turns), with the store's time for the book's decision.
LIVE_LEASE = f"""SELECT {LEASE_COLUMNS}, {EPOCH.format(NOW)} AS now FROM discovery_leases l
    WHERE l.id = %(id)s AND l.expires_at > {NOW} AND {LEASE_IS_MINE} FOR UPDATE"""

# Renew (with the TTL the book decided) and release (a batch of lease ids),
# each one statement: the lease row and its proxy's lease_expires change
# together, and only on a live lease of this fleet.
RENEW = f"""WITH renewed AS (
        UPDATE discovery_leases l
        SET ttl = %(ttl)s, expires_at = {NOW} + make_interval(secs => %(ttl)s)
        WHERE l.id = %(id)s AND l.expires_at > {NOW} AND {LEASE_IS_MINE}
        RETURNING l.*),
    marked AS (
        UPDATE discovery_proxies p SET lease_expires = renewed.expires_at
        FROM renewed WHERE p.name = renewed.proxy)
    SELECT {LEASE_COLUMNS} FROM renewed l"""

RELEASE = f"""WITH ended AS (
        DELETE FROM discovery_leases l
        WHERE l.id = ANY(%(ids)s::text[]) AND l.expires_at > {NOW} AND {LEASE_IS_MINE}
        RETURNING l.id, l.proxy),
    unmarked AS (
        UPDATE discovery_proxies p SET lease_expires = NULL
        FROM ended WHERE p.name = ended.proxy)
    SELECT ended.id, ended.proxy FROM ended"""

# A live lease whose proxy this replica's fleet lacks, ended: the replica
# answers 404 for it, and 404 means the lease has ended for good (a proxy put
# back in the fleet must not bring it back).
END_FOREIGN = f"""WITH ended AS (
        DELETE FROM discovery_leases l
        WHERE l.id = %(id)s AND l.expires_at > {NOW} AND NOT {LEASE_IS_MINE}
        RETURNING l.proxy)
    UPDATE discovery_proxies p SET lease_expires = NULL
    FROM ended WHERE p.name = ended.proxy
    RETURNING p.name"""


def cooldowns_of(proxy: str, also: str = "") -> str:
    """The cooldowns (target -> until, ended ones included) of the proxy named
    by the SQL `proxy`, as one JSON object, for rules.cooling_until and
    rules.merge_cooldown; `also`: a further condition on them (`c`)."""
    return f"""COALESCE((SELECT json_object_agg(c.target, {EPOCH.format("c.until")})
        FROM discovery_cooldowns c WHERE c.proxy = {proxy}{also}), '{{}}')"""


# The store's time and a live lease's proxy's cooldowns (no row: no such lease).
LEASE_COOLDOWNS = f"""SELECT {EPOCH.format(NOW)} AS now, {cooldowns_of("l.proxy")} AS scopes
    FROM discovery_leases l
    WHERE l.id = %(id)s AND l.expires_at > {NOW} AND {LEASE_IS_MINE}"""

ADD_REPORT = f"""INSERT INTO discovery_reports (at, lease_id, proxy, holder, outcome, target)
    VALUES ({NOW}, %(id)s, %(proxy)s, %(holder)s, %(outcome)s, %(target)s)"""

# A proxy's cooldowns and the store's time, for rules.merge_cooldown (a
# report holds its lease's row lock, so reports on one proxy take turns).
COOLDOWNS_OF = f"""SELECT {EPOCH.format(NOW)} AS now, {cooldowns_of("%(proxy)s")} AS scopes"""
DROP_COOLDOWNS = "DELETE FROM discovery_cooldowns WHERE proxy = %(proxy)s"
PUT_COOLDOWN = """INSERT INTO discovery_cooldowns (proxy, target, until)
    VALUES (%(proxy)s, %(target)s, to_timestamp(%(until)s))
    ON CONFLICT (proxy, target) DO UPDATE SET until = excluded.until"""

# Each `error` counts: the proxy's prober takes them all, not the last
# (prober_statements.take_error_reports).
ADD_ERROR = """UPDATE discovery_proxies
    SET error_reports = error_reports + 1, error_report = %(error)s
    WHERE name = %(proxy)s"""

EXPIRE = f"DELETE FROM discovery_leases WHERE expires_at <= {NOW}"
UNMARK_EXPIRED = f"UPDATE discovery_proxies SET lease_expires = NULL WHERE lease_expires <= {NOW}"

PRUNE = (
    f"DELETE FROM discovery_cooldowns WHERE until <= {NOW}",
    f"DELETE FROM discovery_reports WHERE at < {NOW} - make_interval(secs => %(retention)s)",
    """DELETE FROM discovery_reports
       WHERE seq <= (SELECT max(seq) FROM discovery_reports) - %(kept)s""",
)

CLOCK = f"SELECT {EPOCH.format(NOW)} AS now"

# A refused grant, one row per group its selector matched (book/signals.py).
ADD_REFUSALS = f"""INSERT INTO discovery_refusals (at, grp, holder)
    SELECT {NOW}, g, %(holder)s FROM unnest(%(groups)s::text[]) AS g"""
PRUNE_REFUSALS = (
    f"DELETE FROM discovery_refusals WHERE at < {NOW} - make_interval(secs => %(retention)s)",
    """DELETE FROM discovery_refusals
       WHERE seq <= (SELECT max(seq) FROM discovery_refusals) - %(kept)s""",
)
# What GET /v1/signals counts over the last %(window)s seconds: `blocked`
# reports per proxy, refusals per group (in one transaction, with CLOCK).
SINCE = f"{NOW} - make_interval(secs => %(window)s)"
BANS = f"""SELECT proxy, count(DISTINCT target)::int AS sites, count(*)::int AS blocks,
        {EPOCH.format("max(at)")} AS last_at
    FROM discovery_reports WHERE outcome = 'blocked' AND at > {SINCE} GROUP BY proxy"""
REFUSALS = f"""SELECT grp AS "group", count(*)::int AS refused,
        count(DISTINCT holder)::int AS holders,
        {EPOCH.format("min(at)")} AS first_at, {EPOCH.format("max(at)")} AS last_at
    FROM discovery_refusals WHERE at > {SINCE} GROUP BY grp"""

# Each proxy of this fleet the selector matches, with its live lease's end
# and its cooldowns under the grant's scopes, for the book's refusal (409);
# the store's time on every row (one statement: a refusal is one round trip,
# and a refusal with no row needs no time).
CANDIDATES = f"""SELECT p.name, p.health, {EPOCH.format("l.expires_at")} AS leased_until,
        {cooldowns_of("p.name", " AND c.target = ANY(%(scopes)s)")} AS cooldowns,
        {EPOCH.format(NOW)} AS now
    FROM discovery_proxies p
    LEFT JOIN discovery_leases l ON l.proxy = p.name AND l.expires_at > {NOW}
    WHERE {SELECTED}"""

# Every proxy of this fleet with its health and live lease; then the live cooldowns.
PROXIES = f"""SELECT p.name, p.health, p.latency_ms, p.last_error,
        l.holder, {EPOCH.format("l.expires_at")} AS expires_at,
        COALESCE(p.recent_ms, '{{}}') AS recent_ms
    FROM discovery_proxies p
    LEFT JOIN discovery_leases l ON l.proxy = p.name AND l.expires_at > {NOW}
    WHERE {MINE}"""
COOLDOWNS = f"""SELECT c.proxy, c.target, {EPOCH.format("c.until")} AS until
    FROM discovery_cooldowns c JOIN discovery_proxies p ON p.name = c.proxy
    WHERE c.until > {NOW} AND {MINE}"""

# The gauges: this fleet's proxies by health, with how many are leased and
# how many live cooldowns they have (counted here, not shipped row by row).
GAUGES = f"""SELECT p.health, count(*) AS proxies,
        count(*) FILTER (WHERE EXISTS (SELECT 1 FROM discovery_leases l
                                       WHERE l.proxy = p.name AND l.expires_at > {NOW})) AS leased,
        COALESCE(sum((SELECT count(*) FROM discovery_cooldowns c
                      WHERE c.proxy = p.name AND c.until > {NOW})), 0)::int AS cooling
    FROM discovery_proxies p WHERE {MINE} GROUP BY p.health"""

# The prober's view of each proxy whose view changed. The histories travel
# as array literals (unnest would flatten a two-dimensional array) and are
# cast back per row.
WRITE_HEALTH = """UPDATE discovery_proxies p
    SET health = h.health, latency_ms = h.latency, last_error = h.error,
        recent_ms = h.recent::float8[]
    FROM unnest(%(names)s::text[], %(healths)s::text[], %(latencies)s::float8[],
                %(errors)s::text[], %(recents)s::text[])
         AS h(name, health, latency, error, recent)
    WHERE p.name = h.name"""

# What the prober probes besides its own fleet: the proxies only other
# replicas' fleets hold (a fleet is dropped once no replica registers it,
# fleets.py), with what a probe needs.
FOREIGN = """SELECT name, host, port, username, password FROM discovery_proxies
    WHERE host IS NOT NULL AND cardinality(fleets) > 0 AND NOT (%(fleet)s = ANY(fleets))
    ORDER BY name"""

__all__ = [name for name in dir() if name.isupper()]
