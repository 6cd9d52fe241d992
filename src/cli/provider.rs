//! `commitpoint provider check`: before 50,000 sources go out, one tiny real request per
//! configured provider and registered schema says whether the key, the model and the
//! schema are accepted, quoting the provider when they are not, and names whichever of
//! them that provider kind gave no way to check.

use std::path::PathBuf;
use std::process::ExitCode;

use super::serve::config_error;
use super::{EXIT_CONFIG, EXIT_PROBLEMS};
use crate::app::config::{DEFAULT_CONFIG_PATH, Overrides, ServeOptions};
use crate::domain::schema::Registry;
use crate::providers::Probe;

#[derive(Debug, clap::Subcommand)]
pub(super) enum Command {
    /// Send one small synchronous request (billed: a cent or less) per provider and schema;
    /// exit 0 when none is refused, 1 otherwise. Says what each check could not exercise.
    Check(CheckArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub(super) struct CheckArgs {
    /// Configuration file (TOML), as `serve` reads it.
    #[arg(long, env = "COMMITPOINT_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of extra JSON Schemas, one `name@version.json` file each.
    #[arg(long)]
    schema_dir: Option<PathBuf>,
    /// Only this provider, by its `[providers.<name>]` table name (`openai` or `simulator`
    /// for the old `[provider]` table).
    #[arg(long)]
    provider: Option<String>,
    /// Only this schema, e.g. `code-review@1`.
    #[arg(long)]
    schema: Option<String>,
}

pub(super) async fn run(command: Command) -> ExitCode {
    let Command::Check(args) = command;
    let explicit = args.config.is_some();
    let path = args.config.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    let overrides = Overrides { schema_dir: args.schema_dir.clone(), ..Overrides::default() };
    let options = match ServeOptions::load(&path, explicit, overrides) {
        Ok(options) => options,
        Err(e) => return config_error(&e),
    };
    let registry = match Registry::load(options.schema_dir.as_deref()) {
        Ok(registry) => registry,
        Err(e) => return config_error(&e),
    };
    let schemas: Vec<String> = match &args.schema {
        Some(name) => match registry.get(name) {
            Ok(_) => vec![name.clone()],
            Err(e) => return config_error(&e),
        },
        None => registry.names().map(str::to_string).collect(),
    };
    for note in &options.notes {
        eprintln!("commitpoint: note: {note}");
    }
    // The simulators (when configured) run for as long as `built` lives.
    let built = match crate::app::provider_registry::build(&options.providers).await {
        Ok(built) => built,
        Err(e) => return config_error(&e),
    };
    let providers: Vec<_> = built
        .providers
        .iter()
        .map(|p| &p.adapter)
        .filter(|p| args.provider.as_deref().is_none_or(|only| p.name() == only))
        .collect();
    if providers.is_empty() {
        let what = args.provider.as_deref().map_or_else(
            || "no provider is configured".to_string(),
            |name| format!("no provider named {name:?} is configured"),
        );
        eprintln!("commitpoint: {what}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let mut refused = 0usize;
    for provider in &providers {
        for name in &schemas {
            let Ok(schema) = registry.get(name) else { continue };
            match provider.probe(&schema).await {
                Probe::Passed(checked) => println!("{} / {name}: {}", provider.name(), checked.verdict()),
                Probe::Refused(e) => {
                    refused += 1;
                    println!("{} / {name}: REFUSED: {}", provider.name(), e.message());
                }
            }
        }
    }
    if refused == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) }
}
