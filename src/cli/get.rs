//! `commitpoint get`: one extraction, named the way people have it at hand: its id, the
//! first characters of it (the console shows 12), or its tenant and source id.

use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::Value;

use super::{AdminUrl, EXIT_PROBLEMS, EXIT_USAGE};
use crate::domain::identity::IdPrefix;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The extraction id, or its first 4 or more characters (unique among the ids the
    /// token may see).
    #[arg(required_unless_present = "source", conflicts_with = "source")]
    id: Option<String>,
    /// The current revision of a source instead: `TENANT/SOURCE_ID` (the source id may
    /// itself contain `/`), under --schema's name.
    #[arg(long, value_name = "TENANT/SOURCE_ID")]
    source: Option<String>,
    /// The schema --source's revisions are kept under (any version of its name).
    #[arg(long, default_value = crate::domain::schema::BUILTIN_CODE_REVIEW, requires = "source")]
    schema: String,
    /// Print the committed findings (every page) instead of the record.
    #[arg(long, conflicts_with = "diff")]
    findings: bool,
    /// Print the findings introduced, resolved and unchanged against `previous` (the
    /// default) or another revision's id, instead of the record.
    #[arg(long, value_name = "AGAINST", num_args = 0..=1, default_missing_value = "previous")]
    diff: Option<String>,
    #[command(flatten)]
    admin: AdminUrl,
}

/// What went wrong, said once at the edge with its exit code.
enum Miss {
    /// The server answered with an error body: print it as the server said it.
    Server(Value),
    /// The name given does not pick one extraction.
    Usage(String),
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let base = args.admin.resolve();
    let client = args.admin.client()?;
    let api = Api { client: &client, base: &base };
    let id = match resolve(&api, &args).await? {
        Ok(id) => id,
        Err(Miss::Server(body)) => {
            println!("{}", serde_json::to_string_pretty(&body)?);
            return Ok(ExitCode::from(EXIT_PROBLEMS));
        }
        Err(Miss::Usage(message)) => {
            eprintln!("commitpoint: {message}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let answer = if args.findings {
        api.findings(&id).await?
    } else if let Some(against) = &args.diff {
        let id_like = against.len() == 64 && against.bytes().all(|b| b.is_ascii_hexdigit());
        if against != "previous" && !id_like {
            bail!("--diff takes `previous` or an extraction id, not {against:?}");
        }
        api.get(&["v1", "extractions", &id, "diff"], &[("against", against)]).await?
    } else {
        api.get(&["v1", "extractions", &id], &[]).await?
    };
    match answer {
        Ok(body) => {
            println!("{}", serde_json::to_string_pretty(&body)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(body) => {
            println!("{}", serde_json::to_string_pretty(&body)?);
            Ok(ExitCode::from(EXIT_PROBLEMS))
        }
    }
}

/// The full id the arguments name.
async fn resolve(api: &Api<'_>, args: &Args) -> anyhow::Result<Result<String, Miss>> {
    if let Some(source) = &args.source {
        let Some((tenant, source_id)) = source.split_once('/') else {
            return Ok(Err(Miss::Usage(format!("--source takes TENANT/SOURCE_ID, not {source:?}"))));
        };
        let answer = api.get(&["v1", "sources", tenant, source_id], &[("schema", &args.schema)]).await?;
        return Ok(answer
            .map_err(Miss::Server)
            .map(|view| view["current"]["extraction_id"].as_str().unwrap_or_default().into()));
    }
    let id = args.id.as_deref().unwrap_or_default().to_ascii_lowercase();
    if id.len() == 64 {
        return Ok(Ok(id));
    }
    let prefix: IdPrefix = match id.parse() {
        Ok(prefix) => prefix,
        Err(e) => return Ok(Err(Miss::Usage(format!("{id:?}: {e}")))),
    };
    let page = match api.get(&["v1", "extractions"], &[("id_prefix", prefix.as_str()), ("limit", "10")]).await? {
        Ok(page) => page,
        Err(body) => return Ok(Err(Miss::Server(body))),
    };
    let ids: Vec<&str> = page["extractions"]
        .as_array()
        .map(|list| list.iter().filter_map(|e| e["extraction_id"].as_str()).collect())
        .unwrap_or_default();
    Ok(match ids.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(Miss::Usage(format!("no extraction id starts with {:?}", prefix.as_str()))),
        many => Err(Miss::Usage(format!(
            "{:?} is the start of {}{} ids ({}): give more characters",
            prefix.as_str(),
            if many.len() >= 10 { "at least " } else { "" },
            many.len(),
            many.iter().map(|id| &id[..16]).collect::<Vec<_>>().join(", ")
        ))),
    })
}

struct Api<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
}

impl Api<'_> {
    /// GETs the path (each segment percent-encoded): the JSON body, `Err` for an error
    /// status.
    async fn get(&self, segments: &[&str], query: &[(&str, &str)]) -> anyhow::Result<Result<Value, Value>> {
        let mut url = reqwest::Url::parse(self.base).with_context(|| format!("{} is not a URL", self.base))?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("{} cannot take a path", self.base))?
            .pop_if_empty()
            .extend(segments);
        url.query_pairs_mut().extend_pairs(query);
        let response =
            self.client.get(url.clone()).send().await.with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        let body: Value = response.json().await.context("the server sent a non-JSON answer")?;
        Ok(if status.is_success() { Ok(body) } else { Err(body) })
    }

    /// Every page of an extraction's findings, as one array.
    async fn findings(&self, id: &str) -> anyhow::Result<Result<Value, Value>> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("limit", "1000")];
            if let Some(cursor) = &after {
                query.push(("after", cursor));
            }
            let page = match self.get(&["v1", "extractions", id, "findings"], &query).await? {
                Ok(page) => page,
                Err(body) => return Ok(Err(body)),
            };
            all.extend(page["findings"].as_array().cloned().unwrap_or_default());
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_string()),
                None => return Ok(Ok(Value::Array(all))),
            }
        }
    }
}
