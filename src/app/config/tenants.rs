//! `[tenants.<name>]`: how a tenant shares the work with the others (its weight, the
//! in-flight work it may hold, its priority class), and `[scheduler] fair_quantum_bytes`,
//! the bytes each tenant takes per round. Tenants without a table share equally.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::Error;
use crate::store::{DEFAULT_QUANTUM_BYTES, Fairness, Priority, TenantShare};

/// Weights above this would let one tenant's round outlast every other's patience.
const MAX_WEIGHT: u32 = 1_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    pub weight: Option<u32>,
    pub max_in_flight: Option<u64>,
    pub priority: Option<Priority>,
}

pub(super) fn resolve(raw: BTreeMap<String, RawTenant>, quantum_bytes: Option<u64>) -> Result<Fairness, Error> {
    let quantum_bytes = match quantum_bytes {
        None => DEFAULT_QUANTUM_BYTES,
        Some(n) if (1..=64 << 20).contains(&n) => n,
        Some(n) => {
            return Err(Error::Invalid {
                key: "scheduler.fair_quantum_bytes",
                reason: format!("{n} is outside 1..=67108864 (64 MiB)"),
            });
        }
    };
    let mut tenants = HashMap::with_capacity(raw.len());
    for (name, t) in raw {
        super::extras::tenant_ok("tenants", &name)?;
        let weight = t.weight.unwrap_or(1);
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(Error::Invalid {
                key: "tenants.weight",
                reason: format!("{name}: {weight} is outside 1..={MAX_WEIGHT}"),
            });
        }
        if t.max_in_flight == Some(0) {
            return Err(Error::Invalid {
                key: "tenants.max_in_flight",
                reason: format!("{name}: 0 would hold its work forever; leave it unset for no limit"),
            });
        }
        let share =
            TenantShare { weight, max_in_flight: t.max_in_flight, priority: t.priority.unwrap_or(Priority::Normal) };
        tenants.insert(name, share);
    }
    Ok(Fairness { quantum_bytes, tenants })
}

/// The `describe` lines: the quantum, then one line per tenant with terms of its own.
pub(super) fn describe(fairness: &Fairness) -> String {
    let mut lines = vec![format!("# fair scheduling: quantum {} bytes per round", fairness.quantum_bytes)];
    let mut names: Vec<&String> = fairness.tenants.keys().collect();
    names.sort();
    for name in names {
        let share = fairness.share(name);
        let limit = share.max_in_flight.map_or_else(|| "no limit".to_string(), |n| n.to_string());
        lines.push(format!(
            "# tenant {name}: weight {}, max_in_flight {limit}, priority {}",
            share.weight,
            share.priority.as_str()
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> BTreeMap<String, RawTenant> {
        toml::from_str(text).expect("toml")
    }

    #[test]
    fn terms_resolve_with_defaults_and_bad_ones_are_named() {
        let raw = parse("[acme]\nweight = 3\nmax_in_flight = 500\npriority = \"high\"\n[beta]\n");
        let fairness = resolve(raw, None).expect("valid");
        assert_eq!(fairness.quantum_bytes, DEFAULT_QUANTUM_BYTES);
        assert_eq!(
            fairness.share("acme"),
            TenantShare { weight: 3, max_in_flight: Some(500), priority: Priority::High }
        );
        assert_eq!(fairness.share("beta"), TenantShare::default());
        assert_eq!(fairness.share("unlisted"), TenantShare::default());
        let err = resolve(parse("[acme]\nweight = 0\n"), None).expect_err("weight 0");
        assert!(err.to_string().contains("acme: 0 is outside"), "{err}");
        let err = resolve(parse("[acme]\nmax_in_flight = 0\n"), None).expect_err("limit 0");
        assert!(err.to_string().contains("tenants.max_in_flight"), "{err}");
        assert!(toml::from_str::<BTreeMap<String, RawTenant>>("[acme]\npriority = \"urgent\"\n").is_err());
        assert!(toml::from_str::<BTreeMap<String, RawTenant>>("[acme]\nwieght = 2\n").is_err(), "typos are errors");
        let err = resolve(BTreeMap::new(), Some(0)).expect_err("quantum 0");
        assert!(err.to_string().contains("scheduler.fair_quantum_bytes"), "{err}");
        let described =
            describe(&resolve(parse("[acme]\nweight = 3\npriority = \"high\"\n"), Some(8192)).expect("valid"));
        assert_eq!(
            described,
            "# fair scheduling: quantum 8192 bytes per round\n# tenant acme: weight 3, max_in_flight no limit, priority high"
        );
    }
}
