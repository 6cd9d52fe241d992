use super::*;
use crate::app::config::{RawConfig, ServeOptions};

fn options(text: &str) -> Result<ServeOptions, Error> {
    options_with(text, Overrides::default())
}

fn options_with(text: &str, overrides: Overrides) -> Result<ServeOptions, Error> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| Error::Invalid { key: "test", reason: e.to_string() })?;
    ServeOptions::resolve(raw, overrides)
}

fn refusal(text: &str) -> String {
    match options(text) {
        Ok(o) => panic!("accepted: {o:#?}"),
        Err(e) => e.to_string(),
    }
}

const TWO_ACCOUNTS: &str = r#"
    [providers.acct_b]
    kind = "openai"
    base_url = "http://127.0.0.1:9/v1"
    api_key_env = "KEY_B"
    [providers.acct_a]
    kind = "openai"
    model = "gpt-4.1-mini"
    api_key_file = "/run/keys/a"
    [routing]
    default = "acct_a"
    rules = [{ tenant = "globex", provider = "acct_b" }]
"#;

#[test]
fn two_providers_of_one_kind_are_named_tables() {
    let o = options(TWO_ACCOUNTS).unwrap();
    let names: Vec<&str> = o.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["acct_a", "acct_b"]);
    let ProviderSpec::Openai(a) = &o.providers[0].spec else { panic!("{:?}", o.providers[0]) };
    assert_eq!((a.base_url.as_str(), a.model.as_str()), (DEFAULT_OPENAI_BASE_URL, "gpt-4.1-mini"));
    assert_eq!(a.key, KeySource::File("/run/keys/a".into()));
    assert_eq!(o.providers[1].key_source(), Some(&KeySource::Env("KEY_B".into())));
    assert_eq!(o.routes.target("globex", "code-review@1"), Some("acct_b"));
    assert_eq!(o.routes.target("acme", "code-review@1"), Some("acct_a"));
    assert!(o.notes.is_empty(), "the new form needs no note: {:?}", o.notes);
    let described = o.describe();
    assert!(described.contains("[providers.acct_b]\nkind = \"openai\""), "{described}");
    // Keys are only named in comments, so the reparsed tables keep names, kinds and URLs.
    let shape = |p: &[ProviderSettings]| -> Vec<(String, ProviderKind)> {
        p.iter().map(|s| (s.name.clone(), s.kind())).collect()
    };
    let again = options(&described).unwrap_or_else(|e| panic!("{e}\n{described}"));
    assert_eq!(shape(&again.providers), shape(&o.providers), "{described}");
    assert_eq!(again.routes.default.as_deref(), Some("acct_a"), "{described}");
}

#[test]
fn each_kind_has_its_dialect_and_the_targets_use_table_names() {
    let o = options(
        r#"
        [providers.claude]
        kind = "anthropic"
        model = "claude-x"
        [providers.local]
        kind = "chat"
        base_url = "http://127.0.0.1:8000/v1"
        model = "qwen"
        [providers.sim]
        kind = "simulator"
        [routing]
        default = "sim"
        "#,
    )
    .unwrap();
    use crate::domain::schema::Dialect;
    let targets = o.schema_targets();
    assert_eq!(
        targets,
        [
            ("claude".to_string(), Dialect::AnthropicTool),
            ("local".to_string(), Dialect::OpenAiStrict),
            ("sim".to_string(), Dialect::OpenAiStrict),
        ]
    );
    assert_eq!(o.providers[0].key_source(), Some(&KeySource::Env("ANTHROPIC_API_KEY".into())));
    assert_eq!(o.providers[1].key_source(), None, "a chat server may take no key");
    assert_eq!(
        o.providers[2].spec,
        ProviderSpec::Simulator(SimulatorOptions { model: SIMULATOR_MODEL.into(), budget: OpenAiBudget::default() })
    );
}

#[test]
fn bad_provider_tables_are_refused_naming_the_table() {
    for (text, needles) in [
        (
            "[providers.a]\nkind = \"gpt\"\n",
            &["providers.a", "\"gpt\"", "openai, anthropic, generic, chat, simulator"][..],
        ),
        ("[providers.a]\nkind = 3\n", &["providers.a", "kind must be a string"]),
        ("[providers.a]\nmodel = \"m\"\n", &["providers.a", "`kind` is required"]),
        ("[providers.a]\nkind = \"generic\"\nmodel = \"m\"\napi_key_env = \"K\"\n", &["providers.a", "base_url"]),
        ("[providers.a]\nkind = \"chat\"\nmodel = \"m\"\n", &["providers.a", "base_url"]),
        ("[providers.a]\nkind = \"openai\"\nconcurrency = 2\n", &["providers.a", "concurrency"]),
        ("[providers.a]\nkind = \"simulator\"\nbase_url = \"http://x\"\n", &["providers.a", "base_url"]),
        (
            "[providers.a]\nkind = \"generic\"\nbase_url = \"b\"\nmodel = \"m\"\n",
            &["providers.a", "api_key_*", "required"],
        ),
        (
            "[providers.a]\nkind = \"openai\"\napi_key_env = \"A\"\napi_key_file = \"/k\"\n",
            &["providers.a", "only one"],
        ),
        ("[providers.\"a b\"]\nkind = \"openai\"\n", &["providers.a b", "letters, digits"]),
        ("[providers.a]\nkind = \"chat\"\nbase_url = \"b\"\nmodel = \"m\"\nconcurrency = 0\n", &["concurrency"]),
    ] {
        let err = refusal(text);
        for needle in needles {
            assert!(err.contains(needle), "{text:?} → {err:?} should say {needle:?}");
        }
    }
}

#[test]
fn a_name_configured_twice_is_refused() {
    let err = refusal("[provider]\nkind = \"openai\"\n[providers.openai]\nkind = \"openai\"\n");
    assert!(err.contains("\"openai\" is configured twice"), "{err}");
    let flags = Overrides { provider: Some(ProviderChoice::Simulator), ..Overrides::default() };
    let err = options_with("[providers.simulator]\nkind = \"simulator\"\n", flags).unwrap_err().to_string();
    assert!(err.contains("\"simulator\" is configured twice"), "{err}");
}

#[test]
fn several_named_providers_need_a_routing_default() {
    let text = "[providers.a]\nkind = \"simulator\"\n[providers.b]\nkind = \"simulator\"\n";
    let err = refusal(text);
    assert!(err.starts_with("routing.default") && err.contains("a, b"), "{err}");
    let err = refusal(&format!("{text}[routing]\ndefault = \"c\"\n"));
    assert!(err.contains("\"c\" is not configured"), "{err}");
    let one = options("[providers.only]\nkind = \"simulator\"\n").unwrap();
    assert_eq!(one.routes.default.as_deref(), Some("only"), "a single provider takes unrouted work");
}

#[test]
fn old_forms_keep_their_names_and_order_and_say_so() {
    let o = options(
        "[provider]\nkind = \"openai\"\nmodel = \"m\"\n\
         [providers.chat]\nbase_url = \"http://c/v1\"\nmodel = \"m\"\n\
         [providers.anthropic]\nmodel = \"m\"\n\
         [providers.generic]\nbase_url = \"http://g\"\nmodel = \"m\"\napi_key_env = \"K\"\n",
    )
    .unwrap();
    let names: Vec<&str> = o.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["openai", "anthropic", "generic", "chat"], "stored batches keep their provider names");
    let kinds: Vec<&str> = o.providers.iter().map(|p| p.kind().as_str()).collect();
    assert_eq!(kinds, names, "each shorthand's name is its kind");
    assert_eq!(o.routes.default.as_deref(), Some("openai"), "the old primary still takes unrouted work");
    assert_eq!(o.notes.len(), 4, "{:?}", o.notes);
    assert!(o.notes[0].contains("[providers.openai] with kind = \"openai\""), "{:?}", o.notes);
    assert!(o.notes.iter().any(|n| n.contains("add kind = \"anthropic\"")), "{:?}", o.notes);

    let without_primary = options("[providers.chat]\nbase_url = \"b\"\nmodel = \"m\"\n[providers.generic]\nbase_url = \"b\"\nmodel = \"m\"\napi_key_env = \"K\"\n").unwrap();
    assert_eq!(without_primary.routes.default.as_deref(), Some("generic"), "the old default order holds");

    let flags = Overrides {
        provider: Some(ProviderChoice::Simulator),
        model: Some(DEFAULT_MODEL.into()),
        ..Overrides::default()
    };
    let o = options_with("", flags).unwrap();
    assert_eq!(o.providers[0].name, "simulator");
    assert_eq!(
        o.providers[0].spec,
        ProviderSpec::Simulator(SimulatorOptions { model: SIMULATOR_MODEL.into(), budget: OpenAiBudget::default() })
    );
    assert!(o.notes.iter().any(|n| n.contains("--provider")), "{:?}", o.notes);
    assert!(options("").unwrap().notes.is_empty(), "no provider, no note");
}

/// Every kind's output budgets (issue 11) are table keys, with the adapters' defaults, and
/// the old forms set them too; `describe` shows them so the check output reads back.
#[test]
fn output_budgets_are_per_table_with_defaults_and_survive_the_old_forms() {
    let o = options(
        r#"
        [providers.acct]
        kind = "openai"
        max_completion_tokens = 1000
        max_completion_tokens_cap = 4000
        [providers.sim]
        kind = "simulator"
        max_completion_tokens_cap = 2000
        [providers.claude]
        kind = "anthropic"
        model = "c"
        max_tokens_cap = 9000
        [providers.batchco]
        kind = "generic"
        base_url = "https://b"
        model = "m"
        api_key_env = "K"
        max_tokens = 512
        [providers.local]
        kind = "chat"
        base_url = "http://127.0.0.1:1/v1"
        model = "m"
        max_tokens_cap = 2048
        [routing]
        default = "acct"
        "#,
    )
    .unwrap();
    let spec = |name: &str| &o.providers.iter().find(|p| p.name == name).unwrap().spec;
    let ProviderSpec::Openai(acct) = spec("acct") else { panic!() };
    assert_eq!(acct.budget, OpenAiBudget { max_completion_tokens: Some(1000), max_completion_tokens_cap: 4000 });
    let ProviderSpec::Simulator(sim) = spec("sim") else { panic!() };
    assert_eq!(sim.budget, OpenAiBudget { max_completion_tokens: None, max_completion_tokens_cap: 2000 });
    let ProviderSpec::Anthropic(claude) = spec("claude") else { panic!() };
    assert_eq!((claude.max_tokens, claude.max_tokens_cap), (4096, 9000));
    let ProviderSpec::Generic(batchco) = spec("batchco") else { panic!() };
    assert_eq!((batchco.max_tokens, batchco.max_tokens_cap), (Some(512), 8192));
    let ProviderSpec::Chat(local) = spec("local") else { panic!() };
    assert_eq!((local.max_tokens, local.max_tokens_cap), (None, 2048));
    let described = o.describe();
    for line in ["max_completion_tokens = 1000", "max_completion_tokens_cap = 2000", "max_tokens_cap = 9000"] {
        assert!(described.contains(line), "{line}: {described}");
    }
    // The check output reads back to the same providers; the generic table is left out
    // because its required key is only a comment there.
    let described = described.replace("[providers.batchco]", "[providers.batchco_off]");
    let described: String =
        described.split("\n\n").filter(|t| !t.starts_with("[providers.batchco_off]")).collect::<Vec<_>>().join("\n\n");
    let again = options(&described).unwrap_or_else(|e| panic!("{e}\n{described}"));
    let without_generic: Vec<&ProviderSettings> = o.providers.iter().filter(|p| p.name != "batchco").collect();
    assert_eq!(again.providers.iter().collect::<Vec<_>>(), without_generic, "{described}");

    let old = options(
        "[provider]\nkind = \"simulator\"\nmax_completion_tokens = 300\n\
         [providers.anthropic]\nmodel = \"m\"\nmax_tokens = 100\n",
    )
    .unwrap();
    let ProviderSpec::Simulator(sim) = &old.providers[0].spec else { panic!("{:?}", old.providers) };
    assert_eq!(sim.budget, OpenAiBudget { max_completion_tokens: Some(300), max_completion_tokens_cap: 16_384 });
    let ProviderSpec::Anthropic(a) = &old.providers[1].spec else { panic!("{:?}", old.providers) };
    assert_eq!((a.max_tokens, a.max_tokens_cap), (100, 8192));
    assert!(!old.notes.is_empty());
    let only_budget = options("[provider]\nmax_completion_tokens_cap = 100\n").unwrap();
    assert!(only_budget.providers.is_empty() && !only_budget.notes.is_empty(), "an old table with a key is noted");

    for (text, needle) in [
        ("[providers.a]\nkind = \"openai\"\nmax_completion_tokens = 0\n", "max_completion_tokens: must be at least 1"),
        ("[providers.a]\nkind = \"simulator\"\nmax_completion_tokens_cap = 0\n", "max_completion_tokens_cap"),
        ("[providers.a]\nkind = \"chat\"\nbase_url = \"b\"\nmodel = \"m\"\nmax_tokens = 0\n", "max_tokens"),
        ("[providers.a]\nkind = \"openai\"\nmax_tokens = 10\n", "max_tokens"),
        ("[providers.a]\nkind = \"anthropic\"\nmodel = \"m\"\nmax_completion_tokens = 10\n", "max_completion_tokens"),
    ] {
        let err = refusal(text);
        assert!(err.starts_with("providers.a") && err.contains(needle), "{text:?} → {err}");
    }
}

#[test]
fn min_batch_wait_belongs_to_providers_with_a_minimum_job() {
    let bedrock = |extra: &str| {
        format!(
            "[providers.bedrock]\nkind = \"bedrock\"\nregion = \"us-east-1\"\n\
             model = \"anthropic.claude-3-5-haiku-20241022-v1:0\"\n\
             role_arn = \"arn:aws:iam::123456789012:role/commitpoint-batch\"\n\
             input_s3_uri = \"s3://cp-batch-in/in/\"\noutput_s3_uri = \"s3://cp-batch-out/out/\"\n{extra}\n\
             [routing]\ndefault = \"bedrock\"\n"
        )
    };
    let set = options(&bedrock("min_records = 150\nmin_batch_wait = \"30m\"")).expect("accepted");
    let provider = &set.providers[0];
    assert_eq!((provider.min_batch(), provider.min_batch_wait), (150, Some(std::time::Duration::from_secs(1800))));
    assert_eq!(options(&bedrock("")).expect("accepted").providers[0].min_batch_wait, None);
    assert!(refusal(&bedrock("min_batch_wait = \"0s\"")).contains("longer than 0s"));
    assert!(refusal(&bedrock("min_batch_wait = 30")).contains("duration like"));
    let openai = "[providers.openai]\nkind = \"openai\"\nmin_batch_wait = \"1h\"\n[routing]\ndefault = \"openai\"\n";
    assert!(
        refusal(openai).contains("min_batch_wait applies to providers with a minimum job size"),
        "{}",
        refusal(openai)
    );
}

#[test]
fn min_batch_fallback_names_another_provider_without_a_minimum() {
    let config = |extra: &str, others: &str| {
        format!(
            "[providers.bedrock]\nkind = \"bedrock\"\nregion = \"us-east-1\"\n\
             model = \"anthropic.claude-3-5-haiku-20241022-v1:0\"\n\
             role_arn = \"arn:aws:iam::123456789012:role/commitpoint-batch\"\n\
             input_s3_uri = \"s3://cp-batch-in/in/\"\noutput_s3_uri = \"s3://cp-batch-out/out/\"\n{extra}\n\
             {others}[routing]\ndefault = \"bedrock\"\n"
        )
    };
    let claude = "[providers.claude]\nkind = \"anthropic\"\nmodel = \"claude-3-5-haiku-20241022\"\n";
    let set = options(&config("min_batch_fallback = \"claude\"", claude)).expect("accepted");
    let bedrock = set.providers.iter().find(|p| p.name == "bedrock").expect("bedrock");
    assert_eq!(bedrock.min_batch_fallback.as_deref(), Some("claude"));
    assert!(bedrock.describe().contains("min_batch_fallback = \"claude\""), "{}", bedrock.describe());
    assert!(options(&config("", claude)).expect("accepted").describe().contains("# min_batch_fallback: unset"));

    let unknown = refusal(&config("min_batch_fallback = \"claud\"", claude));
    assert!(unknown.starts_with("providers.bedrock") && unknown.contains("not a configured provider"), "{unknown}");
    let itself = refusal(&config("min_batch_fallback = \"bedrock\"", claude));
    assert!(itself.contains("names this provider itself"), "{itself}");
    let second = "[providers.bedrock2]\nkind = \"bedrock\"\nregion = \"us-west-2\"\n\
        model = \"anthropic.claude-3-5-haiku-20241022-v1:0\"\nrole_arn = \"arn:aws:iam::123456789012:role/b\"\n\
        input_s3_uri = \"s3://b-in/in/\"\noutput_s3_uri = \"s3://b-out/out/\"\n";
    let minimum = refusal(&config("min_batch_fallback = \"bedrock2\"", second));
    assert!(minimum.contains("minimum job size of its own (100 records)"), "{minimum}");
    // A second Bedrock whose account takes a job of any size may be the fallback.
    let any_size = format!("{second}min_records = 1\n");
    assert!(options(&config("min_batch_fallback = \"bedrock2\"", &any_size)).is_ok());
    let openai =
        "[providers.openai]\nkind = \"openai\"\nmin_batch_fallback = \"claude\"\n[routing]\ndefault = \"openai\"\n";
    assert!(refusal(openai).contains("min_batch_fallback applies to providers with a minimum job size"));
    assert!(refusal(&config("min_batch_fallback = 3", claude)).contains("must name a provider"));
}
