//! `[store]`: which backend holds the data. redb (one file under `data_dir`) is the
//! default; `postgres` is for deployments that outgrow one host (docs/SCALE-OUT.md).

use serde::Deserialize;

use std::time::Duration;

use super::file::{one_source, parse_duration};
use super::{Error, KeySource};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub backend: Option<BackendKind>,
    /// `postgres://user@host:5432/db`; the password is never part of it.
    pub url: Option<String>,
    pub password_env: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
    pub password_credential: Option<String>,
    /// How long a provider's driving instance holds its lease unless it renews it.
    pub driver_lease: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BackendKind {
    Redb,
    Postgres,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreChoice {
    Redb,
    Postgres { url: String, password: Option<KeySource>, driver_lease: Duration },
}

/// The shortest and longest `driver_lease`: below, a busy database's slow renewal would
/// end terms needlessly; above, a dead driver's providers wait too long for a standby.
const DRIVER_LEASE_RANGE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(600));

impl StoreChoice {
    /// `--store-url` (or `COMMITPOINT_STORE_URL`) chooses PostgreSQL and overrides the file's URL.
    pub(super) fn resolve(raw: &RawStore, url_override: Option<String>) -> Result<StoreChoice, Error> {
        let password = one_source("store.password_*", &raw.password_env, &raw.password_file, &raw.password_credential)?;
        let backend = match (raw.backend, &url_override) {
            (_, Some(_)) => BackendKind::Postgres,
            (Some(kind), None) => kind,
            (None, None) => BackendKind::Redb,
        };
        match backend {
            BackendKind::Redb => {
                if raw.driver_lease.is_some() {
                    return Err(Error::Invalid {
                        key: "store.driver_lease",
                        reason: "only a PostgreSQL store has driving instances to lease providers to; \
                                 remove it or set backend = \"postgres\""
                            .into(),
                    });
                }
                if raw.url.is_some() || password.is_some() {
                    return Err(Error::Invalid {
                        key: "store.url",
                        reason: "a URL or password is set but the backend is redb; set backend = \"postgres\"".into(),
                    });
                }
                Ok(StoreChoice::Redb)
            }
            BackendKind::Postgres => {
                let Some(url) = url_override.or_else(|| raw.url.clone()) else {
                    return Err(Error::Invalid {
                        key: "store.url",
                        reason: "backend = \"postgres\" needs url = \"postgres://user@host:5432/db\" or --store-url"
                            .into(),
                    });
                };
                let options = crate::store::postgres::PgOptions { url: url.clone(), password: None };
                let parsed = crate::store::postgres::parse_url(&options)
                    .map_err(|e| Error::Invalid { key: "store.url", reason: crate::store::error_chain(&e) })?;
                if parsed.get_password().is_some() {
                    return Err(Error::Invalid {
                        key: "store.url",
                        reason: "the URL holds a password; name it with store.password_env, _file or _credential"
                            .into(),
                    });
                }
                let driver_lease = match &raw.driver_lease {
                    None => crate::engine::scheduler::DEFAULT_DRIVER_LEASE,
                    Some(text) => {
                        let lease = parse_duration("store.driver_lease", text)?;
                        let (shortest, longest) = DRIVER_LEASE_RANGE;
                        if lease < shortest || lease > longest {
                            return Err(Error::Invalid {
                                key: "store.driver_lease",
                                reason: format!(
                                    "{text:?} is outside {}..={}",
                                    humantime::format_duration(shortest),
                                    humantime::format_duration(longest)
                                ),
                            });
                        }
                        lease
                    }
                };
                Ok(StoreChoice::Postgres { url, password, driver_lease })
            }
        }
    }

    /// How long a provider's driving instance holds its lease (PostgreSQL); on redb the
    /// one process holds every provider for good.
    pub(crate) fn driver_lease(&self) -> Duration {
        match self {
            StoreChoice::Redb => crate::engine::scheduler::DEFAULT_DRIVER_LEASE,
            StoreChoice::Postgres { driver_lease, .. } => *driver_lease,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            StoreChoice::Redb => "[store]\nbackend = \"redb\"".to_string(),
            StoreChoice::Postgres { url, password, driver_lease } => format!(
                "[store]\nbackend = \"postgres\"\nurl = {url:?}\ndriver_lease = \"{}\"\n# password: {}",
                humantime::format_duration(*driver_lease),
                password.as_ref().map_or_else(|| "none".to_string(), |p| format!("{p} (value redacted)"))
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> RawStore {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn redb_is_the_default_and_the_flag_chooses_postgres() {
        assert_eq!(StoreChoice::resolve(&RawStore::default(), None).unwrap(), StoreChoice::Redb);
        let flag = StoreChoice::resolve(&RawStore::default(), Some("postgres://cp@127.0.0.1:5432/cp".into())).unwrap();
        assert!(matches!(flag, StoreChoice::Postgres { password: None, .. }), "{flag:?}");
    }

    #[test]
    fn postgres_takes_its_password_by_reference_only() {
        let ok = raw("backend = \"postgres\"\nurl = \"postgres://cp@db:5432/cp\"\npassword_env = \"PGPASS\"");
        assert_eq!(
            StoreChoice::resolve(&ok, None).unwrap(),
            StoreChoice::Postgres {
                url: "postgres://cp@db:5432/cp".into(),
                password: Some(KeySource::Env("PGPASS".into())),
                driver_lease: crate::engine::scheduler::DEFAULT_DRIVER_LEASE,
            }
        );
        let inline = raw("backend = \"postgres\"\nurl = \"postgres://cp:hunter2@db:5432/cp\"");
        let err = StoreChoice::resolve(&inline, None).unwrap_err().to_string();
        assert!(err.contains("holds a password") && !err.contains("hunter2"), "{err}");
        let missing = raw("backend = \"postgres\"");
        assert!(StoreChoice::resolve(&missing, None).unwrap_err().to_string().contains("needs url"));
        let two =
            raw("backend = \"postgres\"\nurl = \"postgres://db/cp\"\npassword_env = \"A\"\npassword_file = \"/p\"");
        assert!(StoreChoice::resolve(&two, None).is_err());
        let stray = raw("url = \"postgres://db/cp\"");
        assert!(StoreChoice::resolve(&stray, None).unwrap_err().to_string().contains("backend is redb"));
    }

    #[test]
    fn the_driver_lease_is_postgres_only_and_bounded() {
        let url = "backend = \"postgres\"\nurl = \"postgres://cp@db:5432/cp\"\n";
        let set = StoreChoice::resolve(&raw(&format!("{url}driver_lease = \"4s\"")), None).unwrap();
        assert_eq!(set.driver_lease(), Duration::from_secs(4));
        let default = StoreChoice::resolve(&raw(url), None).unwrap();
        assert_eq!(default.driver_lease(), crate::engine::scheduler::DEFAULT_DRIVER_LEASE);
        for bad in ["500ms", "11m", "soon"] {
            let err = StoreChoice::resolve(&raw(&format!("{url}driver_lease = \"{bad}\"")), None).unwrap_err();
            assert!(err.to_string().contains("store.driver_lease"), "{bad}: {err}");
        }
        let on_redb = StoreChoice::resolve(&raw("driver_lease = \"4s\""), None).unwrap_err().to_string();
        assert!(on_redb.contains("only a PostgreSQL store"), "{on_redb}");
    }
}
