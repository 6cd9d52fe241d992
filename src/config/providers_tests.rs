use super::*;
use crate::config::{RawConfig, ServeOptions};

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
    use crate::schema::Dialect;
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
    assert_eq!(o.providers[2].spec, ProviderSpec::Simulator(SimulatorOptions { model: SIMULATOR_MODEL.into() }));
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
    assert_eq!(o.providers[0].spec, ProviderSpec::Simulator(SimulatorOptions { model: SIMULATOR_MODEL.into() }));
    assert!(o.notes.iter().any(|n| n.contains("--provider")), "{:?}", o.notes);
    assert!(options("").unwrap().notes.is_empty(), "no provider, no note");
}
