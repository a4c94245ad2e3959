"""Writes to the sample schema (``workload.SAMPLE_SCHEMA_CQL``) through cassandra-driver: the demo's traffic on a
real Cassandra (``cassandra-cdc demo``).

Orders with static customer columns, collections and a frozen UDT; status updates, item removals, cancelled
(deleted) orders and a deleted customer partition; sessions with TTLs; page-view counters. Sessions on a TV are
guest sessions of ten minutes: the demo's TTL sweep "an hour later" expires them (events the sweep publishes);
the others last a day.
"""
from __future__ import annotations

import datetime
import decimal
import random
import uuid

KEYSPACE = "shop"
TABLES = ("orders", "sessions", "page_views")
DAY_TTL = 86_400
GUEST_TTL = 600


def schema_for_one_node(schema_cql: str) -> list:
    """The sample schema's statements, with a replication one node can serve (RF 1), and IF NOT EXISTS: under
    load the driver may send a statement again after a connection error, when Cassandra had already applied it."""
    cql = schema_cql.replace("{'class': 'NetworkTopologyStrategy', 'dc1': '3'}",
                             "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    for kind in ("KEYSPACE", "TYPE", "TABLE"):
        cql = cql.replace(f"CREATE {kind} ", f"CREATE {kind} IF NOT EXISTS ")
    return [s.strip() for s in cql.split(";") if s.strip()]


class _Address:
    def __init__(self, street, city, zip):
        self.street, self.city, self.zip = street, city, zip


def write_shop(session, n: int, seed: int = 7) -> int:
    """About ``n`` writes (statements) to the shop tables; returns how many were executed."""
    rng = random.Random(seed)
    s = session
    ins_order = s.prepare("INSERT INTO shop.orders (customer_id, order_day, order_id, status, total, items, tags, "
                          "notes, shipping) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
    set_customer = s.prepare("UPDATE shop.orders SET customer_name = ?, loyalty_points = ? WHERE customer_id = ?")
    set_status = s.prepare("UPDATE shop.orders SET status = ?, items[?] = ? "
                           "WHERE customer_id = ? AND order_day = ? AND order_id = ?")
    drop_item = s.prepare("DELETE items[?] FROM shop.orders WHERE customer_id = ? AND order_day = ? AND order_id = ?")
    cancel = s.prepare("DELETE FROM shop.orders WHERE customer_id = ? AND order_day = ? AND order_id = ?")
    forget = s.prepare("DELETE FROM shop.orders WHERE customer_id = ?")
    ins_session = s.prepare("INSERT INTO shop.sessions (user_id, device, started, ip, pages) VALUES (?, ?, ?, ?, ?) "
                            "USING TTL ?")
    add_page = s.prepare("UPDATE shop.sessions SET pages = pages + ? WHERE user_id = ? AND device = ?")
    view = s.prepare("UPDATE shop.page_views SET views = views + ?, clicks = clicks + ? WHERE page = ? AND day = ?")
    customers = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(max(4, n // 40))]
    orders = []
    cities = ["Utrecht", "Zürich", "Kraków", "São Paulo", "東京"]
    today = datetime.date.today()
    done = 0
    while done < n:
        r = rng.random()
        c = rng.choice(customers)
        if r < 0.35 or not orders:
            key = (c, today - datetime.timedelta(days=rng.randrange(5)), uuid.uuid1())
            s.execute(ins_order, (*key, "new", decimal.Decimal(rng.randrange(100, 99999)) / 100,
                                  {"pen": rng.randrange(1, 5), "ink": rng.randrange(1, 3)},
                                  {rng.choice(["web", "app", "gift"])}, ["leave at the door"],
                                  _Address(f"{rng.randrange(1, 200)} Main St", rng.choice(cities),
                                           rng.randrange(1000, 9999))))
            orders.append(key)
        elif r < 0.45:
            s.execute(set_customer, (f"customer {c.hex[:6]}", rng.randrange(1000), c))
        elif r < 0.60:
            s.execute(set_status, (rng.choice(["paid", "shipped"]), "stamp", 1, *rng.choice(orders)))
        elif r < 0.65:
            s.execute(drop_item, ("pen", *rng.choice(orders)))
        elif r < 0.70:
            s.execute(cancel, orders.pop(rng.randrange(len(orders))))
        elif r < 0.71:
            s.execute(forget, (c,))
            orders = [o for o in orders if o[0] != c]
        elif r < 0.85:
            user, device = rng.randrange(50), rng.choice(["phone", "laptop", "tv"])
            if rng.random() < 0.5:
                s.execute(ins_session, (user, device, datetime.datetime.now(datetime.timezone.utc),
                                        f"10.0.{rng.randrange(256)}.{rng.randrange(256)}", ["/"],
                                        GUEST_TTL if device == "tv" else DAY_TTL))
            else:
                s.execute(add_page, ([f"/p/{rng.randrange(30)}"], user, device))
        else:
            s.execute(view, (rng.randrange(1, 10), rng.randrange(3), f"/p/{rng.randrange(10)}",
                             today - datetime.timedelta(days=rng.randrange(3))))
        done += 1
    return done
