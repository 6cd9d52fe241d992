//! The demo's sources. Its workers answer with the simulator's rule-based reviewer
//! (`simulator::review`), so the demo needs no provider key.

pub(super) struct Source {
    pub tenant: &'static str,
    pub source_id: &'static str,
    pub content: &'static str,
}

pub(super) const SOURCES: &[Source] = &[
    Source {
        tenant: "acme",
        source_id: "payments#101",
        content: "fn charge(card: &str) -> u64 {\n    let amount = parse(card).unwrap();\n    // TODO: idempotency key\n    amount\n}\n",
    },
    Source {
        tenant: "acme",
        source_id: "payments#102",
        content: "const API_PASSWORD: &str = \"hunter2\";\nfn login() { connect(API_PASSWORD).unwrap(); }\n",
    },
    Source {
        tenant: "acme",
        source_id: "search#7",
        content: "fn rank(q: &str) -> Vec<Hit> {\n    let idx = INDEX.read().unwrap();\n    idx.query(q)\n}\n",
    },
    Source {
        tenant: "acme",
        source_id: "infra#12",
        content: "unsafe fn poke(p: *mut u8) { *p = 0; }\n// TODO: remove before release\n",
    },
    Source {
        tenant: "globex",
        source_id: "billing#3",
        content: "def invoice(order):\n    secret = 'sk_live_123'\n    return total(order)\n",
    },
    Source {
        tenant: "globex",
        source_id: "billing#4",
        content: "def refund(order):\n    # TODO: partial refunds\n    return reverse(order)\n",
    },
    Source { tenant: "globex", source_id: "etl#9", content: "rows = load().unwrap()\nfor r in rows:\n    write(r)\n" },
    Source { tenant: "globex", source_id: "etl#10", content: "def clean(x):\n    return x.strip()\n" },
];

/// A second revision of an already-reviewed source: a legitimate new extraction.
pub(super) const REVISION: Source = Source {
    tenant: "acme",
    source_id: "payments#101",
    content: "fn charge(card: &str) -> Result<u64, Error> {\n    let amount = parse(card)?;\n    Ok(amount)\n}\n",
};
