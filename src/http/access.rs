//! Who may call what. With no tokens configured the API is open (and must then listen
//! on loopback only); once an admin token exists, every call but `/healthz` and
//! `/metrics` needs a bearer token: the admin token for everything, a tenant token
//! that sees and submits only its own tenant's extractions, or a worker token that only
//! claims work (of the tenants and schemas it names, if any) and posts results.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use subtle::ConstantTimeEq;

mod token_files;

use super::guesses::{Guesses, Via};
use crate::domain::secret::{KeySource, SecretError};
use crate::store::WorkScope;

/// Shorter tokens can be guessed; generate them with e.g. `openssl rand -hex 16`.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// Why the configured tokens cannot be used. The messages name the file, never a token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("{path}: {reason}")]
    Refused { path: PathBuf, reason: String },
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// A bearer token; compared in constant time and never printed.
#[derive(Clone)]
pub(crate) struct Token(Vec<u8>);

impl Token {
    fn new(text: &str) -> Self {
        Self(text.trim().as_bytes().to_vec())
    }

    fn matches(&self, presented: &[u8]) -> bool {
        // Unequal lengths leak only the length, and tokens are fixed-length in practice.
        bool::from(self.0.as_slice().ct_eq(presented))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct AccessPolicy {
    admin: Option<Token>,
    tenants: Vec<(String, Token)>,
    workers: Vec<(Arc<Worker>, Token)>,
}

/// A worker token's holder: its name (for logs) and the work it may claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Worker {
    pub name: String,
    pub scope: WorkScope,
}

/// The caller a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// No tokens are configured: every caller is trusted (loopback only).
    Open,
    Admin,
    Tenant(String),
    Worker(Arc<Worker>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denied {
    #[error("a bearer token is required (Authorization: Bearer <token>)")]
    Unauthenticated,
    /// A bearer token was sent and matches no configured token: saying so (rather than
    /// "required") points the caller at a stale or mistyped token.
    #[error("invalid token: the bearer token matches neither the admin token nor a tenant's or a worker's")]
    InvalidToken,
    #[error("this call needs the admin token")]
    AdminOnly,
    #[error("this token may only reach tenant {0:?}")]
    OtherTenant(String),
    #[error("this call needs the admin token or a worker token")]
    WorkersOnly,
    #[error("a worker token may only claim work, extend its leases, post results and read schemas")]
    NotForWorkers,
    #[error("worker token {worker:?} may not take work of {what}")]
    OutsideScope { worker: String, what: String },
}

impl AccessPolicy {
    /// Reads the configured tokens. Files must be private (mode 0600 or stricter).
    /// Refuses mistakes that would otherwise be accepted silently: a short token, a
    /// tenant holding the admin token, one token for two tenants, a tenant name no
    /// extraction can carry.
    pub(crate) fn load(
        admin: Option<&KeySource>,
        tenant_tokens: Option<&KeySource>,
        worker_tokens: Option<&KeySource>,
    ) -> Result<Self, LoadError> {
        let admin = match admin {
            Some(source) => {
                let token = Token::new(&source.load_secret()?);
                if token.0.len() < MIN_TOKEN_LEN {
                    return Err(LoadError::Refused {
                        path: PathBuf::from(source.to_string()),
                        reason: format!("the admin token is shorter than {MIN_TOKEN_LEN} characters"),
                    });
                }
                Some(token)
            }
            None => None,
        };
        let tenants = match tenant_tokens {
            Some(source) => token_files::tenant_tokens(source, admin.as_ref())?,
            None => Vec::new(),
        };
        if admin.is_none() && !tenants.is_empty() {
            return Err(LoadError::Invalid {
                key: "access.tenant_tokens_file",
                reason: "tenant tokens need an admin token too (access.admin_token_*)".to_string(),
            });
        }
        let workers = match worker_tokens {
            Some(source) => {
                let taken: Vec<(String, &Token)> = admin
                    .iter()
                    .map(|t| ("the admin token".to_string(), t))
                    .chain(tenants.iter().map(|(name, t)| (format!("the token of tenant {name:?}"), t)))
                    .collect();
                token_files::worker_tokens(source, &taken)?
            }
            None => Vec::new(),
        };
        if admin.is_none() && !workers.is_empty() {
            return Err(LoadError::Invalid {
                key: "access.worker_tokens_file",
                reason: "worker tokens need an admin token too (access.admin_token_*)".to_string(),
            });
        }
        Ok(Self { admin, tenants, workers })
    }

    /// A closed policy without token files, for tests of the routes' layers.
    #[cfg(test)]
    pub(crate) fn with_tokens(admin: &str, tenants: &[(&str, &str)]) -> Self {
        let tenants = tenants.iter().map(|(name, token)| (name.to_string(), Token::new(token))).collect();
        Self { admin: Some(Token::new(admin)), tenants, workers: Vec::new() }
    }

    /// This policy with one more worker token, for tests of the routes' layers.
    #[cfg(test)]
    pub(crate) fn with_worker(mut self, name: &str, token: &str, scope: WorkScope) -> Self {
        self.workers.push((Arc::new(Worker { name: name.to_string(), scope }), Token::new(token)));
        self
    }

    /// Whether no admin token is configured (the API is open, on loopback only).
    pub(crate) fn is_open(&self) -> bool {
        self.admin.is_none()
    }

    /// A digest of every configured token: keys derived with it stop verifying what they
    /// signed once a token changes, so a rotated token also ends the console sessions
    /// opened with the old one.
    pub(crate) fn fingerprint(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        let workers = self.workers.iter().map(|(_, t)| t);
        for token in self.admin.iter().chain(self.tenants.iter().map(|(_, t)| t)).chain(workers) {
            hasher.update(&(token.0.len() as u64).to_le_bytes());
            hasher.update(&token.0);
        }
        for (tenant, _) in &self.tenants {
            hasher.update(&(tenant.len() as u64).to_le_bytes());
            hasher.update(tenant.as_bytes());
        }
        for (worker, _) in &self.workers {
            hasher.update(format!("{worker:?}").as_bytes());
        }
        *hasher.finalize().as_bytes()
    }

    /// Authenticates an `Authorization` header value.
    pub(crate) fn identify(&self, authorization: Option<&str>) -> Result<Caller, Denied> {
        let Some(admin) = &self.admin else {
            return Ok(Caller::Open);
        };
        let presented = authorization
            .and_then(bearer_token)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Denied::Unauthenticated)?
            .as_bytes();
        if admin.matches(presented) {
            return Ok(Caller::Admin);
        }
        // Every token is compared, so timing does not tell which holder (if any) matched.
        let mut found = None;
        for (tenant, token) in &self.tenants {
            if token.matches(presented) && found.is_none() {
                found = Some(Caller::Tenant(tenant.clone()));
            }
        }
        for (worker, token) in &self.workers {
            if token.matches(presented) && found.is_none() {
                found = Some(Caller::Worker(Arc::clone(worker)));
            }
        }
        found.ok_or(Denied::InvalidToken)
    }
}

/// The tokens in force and the count of wrong ones. A reload (`ctl reload`, SIGHUP) swaps
/// the policy whole, so rotated tokens apply at once, and the console sessions opened
/// under the old ones stop verifying (their key is derived from the tokens).
#[derive(Debug)]
pub(crate) struct Access {
    policy: RwLock<Arc<AccessPolicy>>,
    guesses: Guesses,
}

/// Why a presented credential got no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    Denied(Denied),
    /// Too many wrong tokens from this address: the credential was not checked.
    Throttled(Duration),
}

impl Access {
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn new(policy: AccessPolicy) -> Self {
        Self::with_allowance(policy, super::guesses::DEFAULT_ALLOWANCE)
    }

    /// `allowance`: wrong credentials an address may send before its backoff starts.
    pub(crate) fn with_allowance(policy: AccessPolicy, allowance: u32) -> Self {
        Self { policy: RwLock::new(Arc::new(policy)), guesses: Guesses::new(allowance) }
    }

    pub(crate) fn policy(&self) -> Arc<AccessPolicy> {
        Arc::clone(&self.policy.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts `policy` in force; whether its tokens differ from the old ones.
    pub(crate) fn replace(&self, policy: AccessPolicy) -> bool {
        let mut current = self.policy.write().unwrap_or_else(PoisonError::into_inner);
        let changed = current.fingerprint() != policy.fingerprint();
        *current = Arc::new(policy);
        changed
    }

    /// Authenticates `authorization` from client `who`, counting a wrong credential and
    /// refusing to check one from an address that has guessed too often (`guesses.rs`).
    /// A request with no credential at all costs nothing and is not counted.
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&str>,
        who: Option<IpAddr>,
        via: Via,
    ) -> Result<Caller, Refused> {
        let policy = self.policy();
        if policy.is_open() {
            return Ok(Caller::Open);
        }
        let presented = authorization.is_some_and(|a| !a.trim().is_empty());
        let now = crate::domain::clock::now_ms();
        if presented && let Some(wait) = self.guesses.shut_out(who, now) {
            return Err(Refused::Throttled(wait));
        }
        policy.identify(authorization).map_err(|denied| {
            if presented {
                self.guesses.failed(who, via, now);
            }
            Refused::Denied(denied)
        })
    }
}

/// The credentials of a `Bearer` authorization; the scheme name is case-insensitive
/// (RFC 9110 §11.1), so `BEARER x` is as good as `Bearer x`.
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

impl Caller {
    pub(crate) fn require_admin(&self) -> Result<(), Denied> {
        match self {
            Caller::Open | Caller::Admin => Ok(()),
            Caller::Tenant(_) | Caller::Worker(_) => Err(Denied::AdminOnly),
        }
    }

    /// The worker routes: claims, leases and results.
    pub(crate) fn require_worker(&self) -> Result<(), Denied> {
        match self {
            Caller::Open | Caller::Admin | Caller::Worker(_) => Ok(()),
            Caller::Tenant(_) => Err(Denied::WorkersOnly),
        }
    }

    /// The tenant routes: a worker token reads no tenant's extractions, costs or exports.
    pub(crate) fn require_not_worker(&self) -> Result<(), Denied> {
        match self {
            Caller::Worker(_) => Err(Denied::NotForWorkers),
            _ => Ok(()),
        }
    }

    pub(crate) fn may_reach(&self, tenant: &str) -> Result<(), Denied> {
        match self {
            Caller::Tenant(own) if own != tenant => Err(Denied::OtherTenant(own.clone())),
            Caller::Worker(worker) if worker.scope.tenants.as_ref().is_some_and(|t| !t.iter().any(|t| t == tenant)) => {
                Err(Denied::OutsideScope { worker: worker.name.clone(), what: format!("tenant {tenant:?}") })
            }
            _ => Ok(()),
        }
    }

    /// Whether a worker may take (or answer) work of this tenant and schema.
    pub(crate) fn may_work_on(&self, tenant: &str, schema: &str) -> Result<(), Denied> {
        match self {
            Caller::Worker(worker) if !worker.scope.covers(tenant, schema) => Err(Denied::OutsideScope {
                worker: worker.name.clone(),
                what: format!("tenant {tenant:?} with schema {schema:?}"),
            }),
            Caller::Tenant(_) => Err(Denied::WorkersOnly),
            _ => Ok(()),
        }
    }

    /// The scope a claim by this caller runs in: a worker token's, or everything.
    pub(crate) fn work_scope(&self) -> WorkScope {
        match self {
            Caller::Worker(worker) => worker.scope.clone(),
            _ => WorkScope::default(),
        }
    }

    /// The tenant a listing must be restricted to, if any.
    pub(crate) fn tenant_scope(&self) -> Option<&str> {
        match self {
            Caller::Tenant(own) => Some(own),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn policy() -> AccessPolicy {
        AccessPolicy {
            admin: Some(Token::new("admin-secret")),
            tenants: vec![("acme".into(), Token::new("acme-secret")), ("globex".into(), Token::new("globex-secret"))],
            workers: vec![(
                Arc::new(Worker {
                    name: "triage".into(),
                    scope: WorkScope { tenants: Some(vec!["acme".into()]), schemas: None },
                }),
                Token::new("worker-secret"),
            )],
        }
    }

    #[test]
    fn tokens_identify_callers() {
        let p = policy();
        assert_eq!(p.identify(Some("Bearer admin-secret")), Ok(Caller::Admin));
        assert_eq!(p.identify(Some("Bearer acme-secret")), Ok(Caller::Tenant("acme".into())));
        assert_eq!(p.identify(Some("Bearer wrong")), Err(Denied::InvalidToken));
        assert_eq!(p.identify(Some("Basic YWRtaW4=")), Err(Denied::Unauthenticated));
        assert_eq!(p.identify(None), Err(Denied::Unauthenticated));
        assert_eq!(AccessPolicy::default().identify(None), Ok(Caller::Open));
    }

    #[test]
    fn tenants_reach_only_their_own() {
        let acme = Caller::Tenant("acme".into());
        assert!(acme.may_reach("acme").is_ok());
        assert_eq!(acme.may_reach("globex"), Err(Denied::OtherTenant("acme".into())));
        assert_eq!(acme.require_admin(), Err(Denied::AdminOnly));
        assert!(Caller::Admin.may_reach("globex").is_ok());
    }

    #[test]
    fn worker_tokens_reach_only_the_work_routes_and_their_scope() {
        let p = policy();
        let Ok(Caller::Worker(worker)) = p.identify(Some("Bearer worker-secret")) else {
            panic!("the worker token names a worker")
        };
        let caller = Caller::Worker(worker);
        assert_eq!(caller.require_admin(), Err(Denied::AdminOnly), "no backups, erasures or pauses");
        assert_eq!(caller.require_not_worker(), Err(Denied::NotForWorkers), "no tenant's extractions or costs");
        assert!(caller.require_worker().is_ok());
        assert!(caller.may_work_on("acme", "code-review@1").is_ok());
        assert!(matches!(caller.may_work_on("globex", "code-review@1"), Err(Denied::OutsideScope { .. })));
        assert!(caller.may_reach("globex").is_err() && caller.may_reach("acme").is_ok());
        let unscoped = Caller::Worker(Arc::new(Worker { name: "any".into(), scope: WorkScope::default() }));
        assert!(unscoped.may_reach("globex").is_ok(), "a worker without tenants= takes every tenant's work");
        assert_eq!(caller.work_scope().tenants, Some(vec!["acme".to_string()]));
        let tenant = Caller::Tenant("acme".into());
        assert_eq!(tenant.require_worker(), Err(Denied::WorkersOnly), "a tenant token claims no work");
        assert_eq!(tenant.may_work_on("acme", "code-review@1"), Err(Denied::WorkersOnly));
        assert!(Caller::Admin.require_worker().is_ok() && Caller::Admin.work_scope() == WorkScope::default());
    }

    #[test]
    fn token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants");
        let write = |path: &std::path::Path, text: &str| {
            std::fs::write(path, text).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        write(&path, "# tenants\nacme tenant-token-0001\n\nglobex tenant-token-0002\n");
        let admin = dir.path().join("admin");
        write(&admin, "admin-token-00001\n");
        let admin = KeySource::File(admin);
        let tenants = KeySource::File(path.clone());
        let p = AccessPolicy::load(Some(&admin), Some(&tenants), None).unwrap();
        assert_eq!(p.identify(Some("Bearer tenant-token-0002")), Ok(Caller::Tenant("globex".into())));
        assert_eq!(p.identify(Some("Bearer admin-token-00001")), Ok(Caller::Admin));
        assert!(!format!("{p:?}").contains("tenant-token-0001"), "tokens never show in Debug output");
        write(&path, "acme\n");
        assert!(AccessPolicy::load(None, Some(&tenants), None).is_err());

        let refused = [
            (
                "acme tenant-token-0001\nglobex admin-token-00001\n",
                "line 2: the token of tenant \"globex\" is the admin token",
            ),
            (
                "acme tenant-token-0001\n\nglobex tenant-token-0001\n",
                "line 3: the token of tenant \"globex\" is already on line 1",
            ),
            ("ac/me tenant-token-0001\n", "line 1: tenant \"ac/me\" can never match"),
            ("acme short-token\n", "line 1: the token of tenant \"acme\" is shorter than 16"),
        ];
        for (text, want) in refused {
            write(&path, text);
            let message = AccessPolicy::load(Some(&admin), Some(&tenants), None).unwrap_err().to_string();
            assert!(message.contains(want) && message.contains(path.to_str().unwrap()), "{text}: {message}");
            assert!(!message.contains("token-000"), "the token is never printed: {message}");
        }
        write(&dir.path().join("admin"), "admin-short\n");
        assert!(AccessPolicy::load(Some(&admin), None, None).unwrap_err().to_string().contains("shorter than 16"));
    }
}
