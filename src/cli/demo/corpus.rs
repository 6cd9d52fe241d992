//! The demo's sources and its stand-in "model": a deterministic rule-based reviewer that
//! produces `code-review@1` output, so the demo needs no provider key.

use serde_json::{Value, json};

pub struct Source {
    pub tenant: &'static str,
    pub source_id: &'static str,
    pub content: &'static str,
}

pub const SOURCES: &[Source] = &[
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
pub const REVISION: Source = Source {
    tenant: "acme",
    source_id: "payments#101",
    content: "fn charge(card: &str) -> Result<u64, Error> {\n    let amount = parse(card)?;\n    Ok(amount)\n}\n",
};

/// (pattern, rule, severity, summary) — what the stand-in model "notices".
const RULES: &[(&str, &str, &str, &str)] = &[
    ("unwrap()", "no-unwrap", "medium", "unwrap() panics on bad input; return the error instead"),
    ("TODO", "todo-left", "low", "unfinished work left in the change"),
    ("PASSWORD", "hardcoded-secret", "critical", "credential committed in source"),
    ("secret =", "hardcoded-secret", "critical", "credential committed in source"),
    ("unsafe fn", "unsafe-code", "high", "unsafe function without a safety comment"),
];

/// Reviews one source the way a model would answer under Structured Outputs.
pub fn review(source_id: &str, content: &str) -> Value {
    let mut findings = Vec::new();
    for (index, line) in content.lines().enumerate() {
        for (pattern, rule, severity, summary) in RULES {
            if line.contains(pattern) {
                findings.push(json!({
                    "rule": rule,
                    "severity": severity,
                    "file": source_id,
                    "line": index + 1,
                    "summary": summary,
                }));
            }
        }
    }
    json!({ "findings": findings })
}

/// What a confused model sends: a finding on line 0 and an unknown severity.
pub fn broken_review(source_id: &str) -> Value {
    json!({ "findings": [{"rule": "no-unwrap", "severity": "urgent", "file": source_id, "line": 0, "summary": "?"}] })
}
