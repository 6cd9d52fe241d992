//! How many exports run at once, and the handle that ends one early.
//!
//! An export holds a read snapshot and a thread for as long as its client takes to read
//! it (on PostgreSQL also a connection inside an open transaction), so a client that
//! stops reading could pin them for ever, and enough such clients hung every read of
//! every tenant (issue 30). Every export therefore takes a permit first: at most
//! `max_exports` at once on this server and `max_exports_per_tenant` per tenant, refused
//! beyond that rather than queued. The permit is also how a tenant erasure ends the
//! exports of that tenant still streaming from a snapshot taken before it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Error, Service};

pub const DEFAULT_MAX_EXPORTS: usize = 8;
pub const DEFAULT_MAX_EXPORTS_PER_TENANT: usize = 2;
/// A client that takes no data for this long loses its export.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportLimits {
    pub max_exports: usize,
    pub max_per_tenant: usize,
    /// How long an export waits for its client to take the next chunk.
    pub stall_timeout: Duration,
}

impl Default for ExportLimits {
    fn default() -> Self {
        Self {
            max_exports: DEFAULT_MAX_EXPORTS,
            max_per_tenant: DEFAULT_MAX_EXPORTS_PER_TENANT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

/// Which cap refused an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportCap {
    Server,
    Tenant,
}

#[derive(Debug, Default)]
struct Running {
    total: usize,
    /// Each running export of a tenant, by permit number, with the token that ends it.
    by_tenant: HashMap<String, HashMap<u64, CancellationToken>>,
    next: u64,
}

#[derive(Debug, Default)]
pub(super) struct ExportGate {
    limits: ExportLimits,
    running: Mutex<Running>,
}

impl ExportGate {
    pub(super) fn new(limits: ExportLimits) -> Self {
        Self { limits, running: Mutex::default() }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        // The map stays consistent whatever panicked while holding it: every change is
        // one insert or remove.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(self: &Arc<Self>, tenant: &str) -> Result<ExportPermit, Error> {
        let mut running = self.running();
        if running.total >= self.limits.max_exports {
            return Err(Error::TooManyExports { cap: ExportCap::Server, limit: self.limits.max_exports });
        }
        let of_tenant = running.by_tenant.get(tenant).map_or(0, HashMap::len);
        if of_tenant >= self.limits.max_per_tenant {
            return Err(Error::TooManyExports { cap: ExportCap::Tenant, limit: self.limits.max_per_tenant });
        }
        let id = running.next;
        running.next += 1;
        running.total += 1;
        let ended = CancellationToken::new();
        running.by_tenant.entry(tenant.to_string()).or_default().insert(id, ended.clone());
        Ok(ExportPermit { gate: Arc::clone(self), tenant: tenant.to_string(), id, ended })
    }

    fn leave(&self, tenant: &str, id: u64) {
        let mut running = self.running();
        let Some(of_tenant) = running.by_tenant.get_mut(tenant) else { return };
        if of_tenant.remove(&id).is_some() {
            if of_tenant.is_empty() {
                running.by_tenant.remove(tenant);
            }
            running.total -= 1;
        }
    }

    /// Ends every running export of `tenant`; how many there were.
    fn end_tenant(&self, tenant: &str) -> usize {
        let running = self.running();
        let tokens = running.by_tenant.get(tenant).map(|m| m.values().cloned().collect::<Vec<_>>()).unwrap_or_default();
        drop(running);
        tokens.iter().for_each(CancellationToken::cancel);
        tokens.len()
    }
}

/// One running export's place under the caps, given back when dropped.
#[derive(Debug)]
pub struct ExportPermit {
    gate: Arc<ExportGate>,
    tenant: String,
    id: u64,
    ended: CancellationToken,
}

impl ExportPermit {
    /// Cancelled once the export must stop early (its tenant was erased).
    pub fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    pub fn stall_timeout(&self) -> Duration {
        self.gate.limits.stall_timeout
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}

impl Drop for ExportPermit {
    fn drop(&mut self) {
        self.gate.leave(&self.tenant, self.id);
    }
}

impl Service {
    /// A place for one export of `tenant`, or the cap that is full.
    pub fn start_export(&self, tenant: &str) -> Result<ExportPermit, Error> {
        self.exports.enter(tenant)
    }

    /// Ends the exports of `tenant` that are still running (after its erasure).
    pub(super) fn end_exports(&self, tenant: &str) -> usize {
        self.exports.end_tenant(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max_exports: usize, max_per_tenant: usize) -> Arc<ExportGate> {
        Arc::new(ExportGate::new(ExportLimits { max_exports, max_per_tenant, ..ExportLimits::default() }))
    }

    fn refused_by(result: Result<ExportPermit, Error>) -> ExportCap {
        match result {
            Err(Error::TooManyExports { cap, .. }) => cap,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn caps_per_tenant_and_per_server_and_permits_come_back_when_dropped() {
        let gate = gate(3, 2);
        let a1 = gate.enter("a").unwrap();
        let _a2 = gate.enter("a").unwrap();
        assert_eq!(refused_by(gate.enter("a")), ExportCap::Tenant);
        let _b1 = gate.enter("b").unwrap();
        assert_eq!(refused_by(gate.enter("c")), ExportCap::Server);
        drop(a1);
        let _c1 = gate.enter("c").unwrap();
        assert_eq!(refused_by(gate.enter("a")), ExportCap::Server);
    }

    #[test]
    fn ending_a_tenant_cancels_only_its_exports() {
        let gate = gate(4, 4);
        let a = gate.enter("a").unwrap();
        let b = gate.enter("b").unwrap();
        assert_eq!(gate.end_tenant("a"), 1);
        assert!(a.ended().is_cancelled());
        assert!(!b.ended().is_cancelled());
        drop(a);
        assert_eq!(gate.end_tenant("a"), 0);
    }
}
